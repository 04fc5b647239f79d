"""The layout (dp, pp, microbatches, strategy, min_stages) has one home, the job's contract
(`job.config`): drop the copy plans stored before (`controlplane.planning.plans.PLAN_LAYOUT_FIELDS`;
`JobPlan.from_dict` ignores it anyway). The contract always held the same values."""

from django.db import migrations

# Written out, not imported: a migration must not change when the code's constant does.
LAYOUT_KEYS = ("dp", "pp", "microbatches", "strategy", "schedule", "min_stages")


def drop_layout_from_plans(apps, schema_editor):
    TrainingJob = apps.get_model("jobs", "TrainingJob")
    for job in TrainingJob.objects.only("id", "plan").iterator(chunk_size=500):
        plan = job.plan or {}
        if any(key in plan for key in LAYOUT_KEYS):
            job.plan = {k: v for k, v in plan.items() if k not in LAYOUT_KEYS}
            job.save(update_fields=["plan"])


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0010_prepare_shares"),
    ]

    operations = [
        migrations.RunPython(drop_layout_from_plans, migrations.RunPython.noop),
    ]
