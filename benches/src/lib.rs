//! Benchmarks live in `benches/`; this library is empty on purpose (Cargo needs a target).
