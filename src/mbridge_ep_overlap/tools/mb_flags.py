"""Megatron-Bridge's performance-script spellings of the flags ``run_script.py`` shares with it.

Contract: ``translate(argv)`` rewrites the flags of MB's ``scripts/performance/argument_parser.py``
(read at NVIDIA-NeMo/Megatron-Bridge commit 0011064) that mean what one of ours means into ours -
``--expert_model_parallel_size 8`` / ``-ep 8`` -> ``--ep 8``, ``--moe_flex_dispatcher_backend
hybridep`` -> ``--dispatcher hybridep`` (``None``: alltoall, as in MB), ``--moe_a2a_overlap true`` ->
``--ep-overlap on`` with delayed wgrad on unless ``--delay-wgrad`` is given (MB's
``--moe_a2a_overlap true`` sets both) - in ``--flag value`` and ``--flag=value`` form. Where MB's
behaviour is broken ours does what the flag says: ``--moe_a2a_overlap false`` turns overlap off
(in MB it changes nothing). Any other flag of MB's parser is bad usage naming it (``UsageError``,
exit 2), never ignored. ``TABLE`` is the table ``docs/run_script.md`` shows (a test keeps the two
equal). No torch or Megatron import.
"""

from __future__ import annotations

from ..base.errors import UsageError

# MB spelling(s) -> our flag, for flags that take the same value
SAME = {
    ("--tensor_model_parallel_size", "-tp"): "--tp",
    ("--pipeline_model_parallel_size", "-pp"): "--pp",
    ("--virtual_pipeline_model_parallel_size", "-vp"): "--vpp",
    ("--context_parallel_size", "-cp"): "--cp",
    ("--expert_model_parallel_size", "-ep"): "--ep",
    ("--expert_tensor_parallel_size", "-et"): "--etp",
    ("--global_batch_size", "-gb"): "--global-batch-size",
    ("--micro_batch_size", "-mb"): "--micro-batch-size",
    ("--seq_length", "-sl"): "--seq-length",
    ("--max_steps", "-ms"): "--max-steps",
    ("--num_gpus", "-ng"): "--num-gpus",
    ("-g",): "--gpu",
}
DRYRUN = ("-d",)  # MB's -d/--dryrun: builds the config and writes it, trains nothing (ours writes the YAML)
A2A_OVERLAP = "--moe_a2a_overlap"
FLEX_BACKEND = "--moe_flex_dispatcher_backend"
_TRUE, _FALSE = ("true", "1", "t", "yes", "y"), ("false", "0", "f", "no", "n")  # MB's bool_arg

# the rest of MB's parser: flags with no counterpart here (their config field can be set as a
# key=value override; the Slurm ones belong to launch_slurm.py)
UNSUPPORTED = (
    "--domain", "-m", "--model_family_name", "-mr", "--model_recipe_name", "--use_recipes", "-nh", "--nemo_home",
    "--detach", "--max_retries", "--hidden_size", "--num_layers", "--pipeline_model_parallel_layout",
    "--first_k_dense_replace", "--task", "--lr", "--min_lr", "--warmup_iters", "--pretrained_checkpoint",
    "--save_dir", "--load_dir", "--save_interval", "--most_recent_k", "--data", "--c4_root", "--c4_train_shards",
    "--dataset_paths", "--dataset_root", "--index_mapping_dir", "--dataset_name", "--packed_sequence", "--head_only",
    "--diffusion_dataset_path", "--tokenizer_type", "--tokenizer_model", "--vocab_size", "-hf", "--hf_token",
    "--offline", "-a", "--account", "-p", "--partition", "-t", "--time_limit", "-gn", "--gpus_per_node", "-i",
    "--container_image", "-cm", "--custom_mounts", "-ce", "--custom_env_vars", "-E", "--env", "-cs",
    "--custom_srun_args", "-cb", "--custom_bash_cmds", "--gres", "--additional_slurm_params", "--packager",
    "--enable_pct_binding", "--dgxc_cluster", "--dgxc_base_url", "--dgxc_kube_apiserver_url", "--dgxc_app_id",
    "--dgxc_app_secret", "--dgxc_project_name", "--dgxc_pvc_claim_name", "--dgxc_pvc_mount_path",
    "--kubeflow_namespace", "--kubeflow_workdir_pvc", "--kubeflow_workdir_pvc_path", "--kubeflow_image_pull_secrets",
    "-c", "--compute_dtype", "--optimizer_type", "-vb", "--enable_vboost", "-lgc", "--lock_gpu_freq", "-en",
    "--enable_nsys", "--export_nsys_sqlite", "-pyp", "--pytorch_profiler", "--profiling_start_step",
    "--profiling_stop_step", "-mh", "--record_memory_history", "--profiling_gpu_metrics", "--profiling_ranks",
    "--nsys_trace", "--nsys_extra_args", "--use_tokendrop", "--use_megatron_fsdp", "--nccl_ub", "--cuda_graph_impl",
    "--cuda_graph_scope", "-rl", "--recompute_num_layers", "-ol", "--activation_offload_layers", "--recompute_modules",
    "--deterministic", "-wdk", "--wandb_key", "-wdp", "--wandb_project_name", "-wde", "--wandb_entity_name", "-wdj",
    "--wandb_experiment_name", "-wds", "--wandb_save_dir", "-l", "--log_dir", "--save_config_filepath", "--dump_env",
    "-cv", "--config_variant", "--list_config_variants", "--is_long_convergence_run", "--retry_on_testing_failure",
    "--golden_values_path", "--timing_threshold", "--skip_first_percent_time", "--correlation_threshold",
    "--high_loss_tolerance", "--medium_loss_tolerance", "--low_loss_tolerance", "--final_loss_tolerance",
    "--max_outlier_ratio", "--outlier_threshold", "--skip_first_percent_loss", "--memory_threshold",
    "--eval_time_start_step", "--eval_time_end_step",
)

TABLE = [  # (MB's spelling, ours, how ours differs) - docs/run_script.md
    *((" / ".join(mb), ours, "same meaning") for mb, ours in SAME.items()),
    ("-d", "--dryrun", "writes the resolved YAML into --output-dir (MB: --save_config_filepath)"),
    (f"{A2A_OVERLAP} true|false", "--ep-overlap on|off",
     "true: overlap on and delayed wgrad on unless --delay-wgrad is given (as MB); false: overlap really off "
     "(MB changes nothing)"),
    (f"{FLEX_BACKEND} deepep|hybridep|None", "--dispatcher deepep|hybridep|alltoall", "None: alltoall (as MB)"),
]

_OURS = {flag: ours for mb, ours in SAME.items() for flag in mb}


def _split(argv: list[str]) -> list[tuple[str, str | None]]:
    """(token, the value written ``--flag=value``) for each token."""
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        out.append((flag, value) if eq and token.startswith("-") else (token, None))
    return out


def translate(argv: list[str]) -> list[str]:
    """``argv`` with MB's spellings rewritten into ours (module docstring); UsageError for MB's others."""
    out: list[str] = []
    a2a: bool | None = None
    tokens = _split(argv)
    i = 0
    while i < len(tokens):
        flag, inline = tokens[i]
        i += 1
        if flag in UNSUPPORTED:
            raise UsageError("flag of Megatron-Bridge's performance scripts", flag,
                             "the flags run_script.py shares with them (docs/run_script.md); set the config field as "
                             "a key=value override instead", "unsupported")
        if flag not in _OURS and flag not in DRYRUN and flag not in (A2A_OVERLAP, FLEX_BACKEND):
            out.append(argv[i - 1])
            continue
        if flag in DRYRUN:
            out.append("--dryrun")
            continue
        value = inline
        if value is None:
            if i >= len(tokens) or tokens[i][0].startswith("-"):
                raise UsageError(flag, None, "a value after it", "missing")
            value = argv[i]
            i += 1
        if flag == A2A_OVERLAP:
            if value.lower() not in _TRUE + _FALSE:
                raise UsageError(flag, value, "true or false (also 1/0, t/f, yes/no, y/n)", "invalid")
            a2a = value.lower() in _TRUE
        elif flag == FLEX_BACKEND:
            if value not in ("deepep", "hybridep", "None"):
                raise UsageError(flag, value, ("deepep", "hybridep", "None"), "invalid")
            if any(t == "--dispatcher" or t.startswith("--dispatcher=") for t in argv):
                raise UsageError(FLEX_BACKEND, "with --dispatcher", "one of the two (they set the same thing)",
                                 "conflicting")
            out += ["--dispatcher", "alltoall" if value == "None" else value]
        else:
            out += [_OURS[flag], value]
    if a2a is not None:
        if any(t == "--ep-overlap" or t.startswith("--ep-overlap=") for t in out):
            raise UsageError(A2A_OVERLAP, "with --ep-overlap", "one of the two (they set the same thing)", "conflicting")
        out += ["--ep-overlap", "on" if a2a else "off"]
        if a2a and not any(t == "--delay-wgrad" or t.startswith("--delay-wgrad=") for t in out):
            out += ["--delay-wgrad", "on"]
    return out
