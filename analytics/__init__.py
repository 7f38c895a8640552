"""Analytics: the pipeline's events as Parquet tables, queried with DuckDB.

`rows` turns records into table rows (pure), `warehouse` writes them as Parquet and
opens DuckDB views over them that count each event once, `report` holds the queries,
`stage` is the Kafka adapter (`chatpipe analytics ingest`).
"""
