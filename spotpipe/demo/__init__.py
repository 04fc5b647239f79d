"""`spotpipe demo`: the whole product on one machine (docs/demo.md). Apart from the user's client
(`spotpipe/`, which never imports this package) because it runs a control plane in-process.

- `run`: the command itself (migrate, seed, start the stack, submit, drive, report);
- `processes`: start and stop the local stack's processes (web server, worker, beat);
- `seed` and `market`: the catalogue, the bundled synthetic spot market and the demo team;
- `driver` and `preemption_script`: submit the job and fire a trace's preemptions at it;
- `learning` and `report`: what the job learned and what it cost;
- `history`: synthetic dashboard history (screenshots, benchmarks).

Nothing is imported here: most modules need Django set up first (`run` does that)."""
