"""The data path: build workers (server-built leases), direct mode (clients build their batches),
the dataset views of the UI and scripts, and a served iteration's run record."""
