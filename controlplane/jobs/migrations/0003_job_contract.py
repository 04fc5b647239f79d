"""The job contract: `config` (the runtime's JobConfig) replaces `model_spec`, and `plan` becomes the
typed JobPlan. Existing jobs are translated the way the agent translated them until now."""

from django.db import migrations, models


def _config(spec: dict, plan: dict, strategy: str, steps: int) -> dict:
    kind = spec.get("kind", "mlp")
    model = {"kind": kind, "n_layer": spec.get("layers", 4), "n_embd": spec.get("d_model", 32)}
    if kind == "gpt":
        model.update(n_head=spec.get("heads", 2), seq_len=spec.get("seq_len", 16), vocab_size=spec.get("vocab", 64))
    elif "in_features" in spec:
        model["in_features"] = spec["in_features"]
    dp, pp = int(plan.get("dp") or 1), int(plan.get("pp") or 1)
    config = {
        "model": model, "dp": dp, "pp": pp,
        "microbatches": max(1, int(spec.get("micro_batches", 2 * dp)) // dp),
        "global_batch": int(spec.get("global_batch", 8)),
        "strategy": "recycle" if strategy in ("", "auto") else strategy,
        "steps": steps, "seed": int(plan.get("seed", 0)),
    }
    config.update(plan.get("runtime") or {})
    return config


def _plan(plan: dict, config: dict) -> dict:
    provider = plan.get("provider") or "local"
    if plan.get("pools"):
        pools = [{"instance_type": p["instance_type"], "zone": p.get("zone") or ""} for p in plan["pools"]]
    elif provider == "local":
        pools = [{"instance_type": "local.node", "zone": ""}]
    else:
        pools = [{"instance_type": plan.get("instance_type") or "p3.2xlarge", "zone": z}
                 for z in plan.get("zones") or [""]]
    return {
        "provider": provider, "pools": pools, "nodes": int(plan.get("nodes") or config["dp"] * config["pp"]),
        "dp": config["dp"], "pp": config["pp"], "microbatches": config["microbatches"],
        "strategy": config["strategy"], "chosen_by": "user", "objective": "", "predicted": None, "runner_ups": [],
        "min_stages": int(plan.get("min_stages") or 1),
    }


def forwards(apps, schema_editor):
    TrainingJob = apps.get_model("jobs", "TrainingJob")
    for job in TrainingJob.objects.all().iterator():
        config = _config(job.model_spec or {}, job.plan or {}, job.strategy, job.target_steps)
        job.plan = _plan(job.plan or {}, config)
        job.config = config
        job.save(update_fields=["config", "plan"])


class Migration(migrations.Migration):
    dependencies = [("jobs", "0002_lean_indexes")]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="config",
            field=models.JSONField(
                default=dict,
                help_text="The runtime's JobConfig (runtime/config.py): model, batch, layout, strategy, seed...",
            ),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.RemoveField(model_name="trainingjob", name="model_spec"),
        migrations.AlterField(
            model_name="trainingjob",
            name="plan",
            field=models.JSONField(
                blank=True, default=dict,
                help_text="controlplane.planning.plans.JobPlan: provider, pools, nodes, dp, pp, ...",
            ),
        ),
    ]
