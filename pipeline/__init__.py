"""The data pipeline: PySpark jobs over rebalance journals and assignor simulations.

``groupcoord analyze`` turns coordinator journals (SQLite files, or Parquet
written by ``groupcoord journal export``) into Parquet tables and an HTML
report; ``groupcoord simulate`` sweeps the real assignors over group shapes and
churn patterns. Both run on ``local[*]`` by default and unchanged on a cluster
(docs/pipeline.md). Nothing here imports pyspark at module level except the
Spark job modules themselves, so ``groupcoord --help`` stays fast.
"""
