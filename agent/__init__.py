"""spotpipe node agent: enrols with the control plane, heartbeats, watches the metadata endpoint
for interruption notices, and runs the runtime worker for its assignment."""
