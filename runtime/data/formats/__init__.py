"""One module per data format, each with `open_source(uri, spec, model, cache_dir) -> Dataset`."""
