"""Helpers shared by the test suites: an S3-protocol server (``s3server``),
test doubles of the engine's recovery hooks (``engine_fakes``) and the child
process of the state-store crash tests (``state_child``)."""
