"""The apps over the library: CLI, API server and collector, audit, batch, reports, widgets and trainer interop."""
