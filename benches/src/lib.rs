//! kvfabric-benches: benchmark drivers run by `kvfabric bench <name>`.
//!
//! Every figure is reported as a ratio against a physical limit or a real
//! peer (iperf3, fio, redis-server, memcpy, llama.cpp) measured in the same run.
