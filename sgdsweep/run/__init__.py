"""Running a sweep: the command line, the Dask cluster, shard execution, locking, progress."""
