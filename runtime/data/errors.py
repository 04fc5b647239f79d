"""The error every data module raises, torch-free (`spotpipe data prepare`'s worker processes
import the data modules without torch)."""


class DataError(ValueError):
    """Data a node cannot use (a missing file, a token file of the wrong size, a token id beyond the
    model's vocabulary...). The message names the value and what was expected; a worker that meets
    one fails the job once with it (no retry can fix the data)."""
