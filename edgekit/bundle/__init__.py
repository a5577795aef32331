"""Writing bundles: staging directory with atomic commit, golden outputs, manifest, packing.
Reading and verifying bundles is the runtime's job (``edgekit_runtime.bundle``)."""
