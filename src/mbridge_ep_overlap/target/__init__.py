"""The target: the cluster a configuration will run on, hardware and software stack.

``cluster`` (plain data and ``describe``), ``gpus`` (the GPU catalogue), ``probe`` (this machine),
``simulate`` (fake the target's hardware and version gates for a dry run), ``simulated_finalize``
(MB's real finalize for a described target), ``offline`` (architecture files without the hub) and
``shims`` (placeholders for optional packages MB imports unconditionally).
"""
