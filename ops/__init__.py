"""Operating chatpipe: replaying what the bus recorded and the dead-letter queue."""
