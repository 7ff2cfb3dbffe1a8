"""The tools around the library: the command line (``cli`` and one module per command), training
and dry runs (``run``), Slurm jobs (``slurm``), the benchmark (``bench``, ``launch``, ``evidence``,
``trace``, ``numerics``), the log verifier (``logs``) and the diagnostics (``doctor``)."""
