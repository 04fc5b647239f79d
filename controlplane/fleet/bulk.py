"""Bulk writes for the notice processor: one statement for a batch of rows."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Model


def bulk_update_by_pk(model: type[Model], objs: Sequence[Model], fields: Sequence[str]) -> int:
    """Write `fields` of every object in `objs` with one statement.

    On PostgreSQL: `UPDATE t SET f = v.f FROM (VALUES (pk, f...), ...) AS v WHERE t.id = v.pk`.
    Django's `bulk_update` builds a `CASE WHEN id = ... THEN ...` per field and row, which costs
    more Python than the rest of a notice's processing together (profiled: about 2 ms per notice
    for six fields). Other databases use `bulk_update`."""
    if not objs:
        return 0
    if connection.vendor != "postgresql":
        return model._default_manager.bulk_update(objs, fields)
    meta = model._meta
    pk = meta.pk
    columns = [meta.get_field(name) for name in fields]
    qn = connection.ops.quote_name
    types = [pk.db_type(connection), *(f.db_type(connection) for f in columns)]
    row = "(" + ", ".join(f"%s::{t}" for t in types) + ")"
    aliases = ["pk", *(f"c{i}" for i in range(len(columns)))]
    params: list = []
    for obj in objs:
        params.append(obj.pk)
        params.extend(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in columns)
    sets = ", ".join(f"{qn(f.column)} = v.{alias}" for f, alias in zip(columns, aliases[1:], strict=True))
    sql = (
        f"UPDATE {qn(meta.db_table)} AS t SET {sets} FROM (VALUES {', '.join([row] * len(objs))}) "
        f"AS v({', '.join(aliases)}) WHERE t.{qn(pk.column)} = v.pk"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
