"""The embedded broker (`spotfs://`): whole messages only, through a real kombu connection."""

from __future__ import annotations

from kombu import Connection

from controlplane import broker


def _connection(folder) -> Connection:
    broker.register()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
               "control_folder": str(folder / "control"), "polling_interval": 0.01}
    return Connection("spotfs://", transport_options=options)


# Each test uses its own queue name: kombu keeps virtual-transport bindings per Transport class,
# across connections.


def test_messages_round_trip(tmp_path):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("round-trip")
        for i in range(3):
            queue.put({"n": i})
        got = [queue.get(timeout=2) for _ in range(3)]
        for message in got:
            message.ack()
        # Order is by millisecond of publication (as in kombu's transport), not strict FIFO.
        assert sorted(m.payload["n"] for m in got) == [0, 1, 2]
        queue.close()


def test_a_message_still_being_written_is_not_consumed(tmp_path):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("partial")
        # What a writer leaves on disk before its rename: the reader must not take it.
        (tmp_path / "1_partial.partial.msg.part").write_bytes(b'{"trunc')
        queue.put({"whole": True})
        message = queue.get(timeout=2)
        message.ack()
        assert message.payload == {"whole": True}
        assert (tmp_path / "1_partial.partial.msg.part").exists()
        queue.close()
