"""The commands users run: the command line (``cli`` and one module per command, named after it:
``plan``, ``calibrate``, ``diagnose``, ``verify_log``, ``rule``, ``doctor``; ``bench`` is
``lab.bench_command``), training and dry runs (``run``), Slurm jobs (``slurm``) and the generated
docs (``gen_docs``). The measurement lab is ``lab``; the plumbing both share is ``runtime``."""
