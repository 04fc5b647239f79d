"""Upper bounds for integer inputs, so an out-of-range value is a 400 naming the field rather
than a database error (PostgreSQL integer columns, SQLite's 64-bit integers)."""

MAX_ID = 2**63 - 1  # BigAutoField primary keys
MAX_COUNT = 2**31 - 1  # steps, generations and other PositiveIntegerField columns
