"""What every entry point and every launched rank runs on, below the commands (``tools``) and the
lab (``lab``): the exit-code contract (``exits``, ``upstream_warnings``), the ``RunSpec`` flag table
(``flags``) and the evidence a rank leaves behind (``run_evidence``, ``rank_evidence``, ``watchdog``)."""
