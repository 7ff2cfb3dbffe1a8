"""The measurement lab: the benchmark (``bench``, ``bench_command``, ``tables``), the knob search
(``tune``), bench results and their readers (``results``), launching ranks (``launch``,
``shared_gpu``), what a measured run records (``evidence``, ``trace``), loss parity (``numerics``) and
the dispatcher smoke test (``smoke``, ``smoke_worker``). It imports ``runtime`` and the layers below,
never ``tools``; the commands in ``tools`` call into it."""
