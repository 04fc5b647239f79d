"""A job's artifact folder is named with a key of its own beside its id (`controlplane.jobs.artifacts`).
Jobs made before keep an empty key, so their folder (`job-<id>`) and what is in it stay where they are;
new jobs get a random key."""

from django.db import migrations, models

import controlplane.jobs.models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0011_plan_without_layout")]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="artifacts_key",
            field=models.CharField(blank=True, default="", editable=False, max_length=16),
        ),
        migrations.AlterField(
            model_name="trainingjob",
            name="artifacts_key",
            field=models.CharField(
                blank=True, default=controlplane.jobs.models.new_artifacts_key, editable=False, max_length=16,
                help_text="Names the job's artifact folder with its id, so a job whose id an earlier database "
                "already used (a reset, another control plane on the same store) never reads or prunes that "
                "job's checkpoints. Empty for jobs made before it existed: their folder stays job-<id>."),
        ),
    ]
