# The hourly price roll-up moved to the market app (controlplane/market/rollup.py). It is a cache of
# SpotPrice, so its tables are dropped here and rebuilt there by the next refresh.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('frontend', '0001_initial'),
    ]

    operations = [
        migrations.DeleteModel(name='PriceRollupState'),
        migrations.DeleteModel(name='PriceHour'),
    ]
