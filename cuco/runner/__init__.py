"""The evaluation runner: build, launch, verify, time, bound. Owned by the framework, never by candidates."""
