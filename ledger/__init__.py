"""The usage ledger: token totals per account and period, written by billing, read by
the gateway's quotas and rate limits; on SQLite (`store`) or Cassandra (`cassandra`)."""
