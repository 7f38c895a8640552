"""Retrieval over a user's own documents: a file's text (`extract`), its
chunks (`chunking`), their ranking against a message and the prompt block and
citations made of the best (`ranking`), and the service that runs these with the
embedding model off the event loop and the conversation store (`documents`).

A library: the gateway uses it for turns that name `file_ids`; a tool stage could
search the same chunks.
"""
