//! The end-to-end tests: one test binary, one module per area (as kube-rs and linkerd lay theirs out), so
//! the harness (`netcm_e2e`, `e2e/src`) and the test code link once instead of once per area. Each module
//! opens with a `//!` that says what it proves. One area alone:
//! `cargo test -p netcm-e2e --test e2e -- --test-threads=1 check::` (a filter is a substring of the test's
//! path, so end it with `::`).
//!
//! `pod_network*` and `chart_on_a_real_node` need the machine's multi-node cluster (`hack/cluster.sh`); the
//! rest the control plane of `hack/controlplane.sh`.

mod allocator_adversary;
mod chart_on_a_real_node;
mod chart_rbac;
mod check;
mod cluster_cidrs;
mod crd_upgrade;
mod credentials_rotate;
mod example_controller;
mod faults_outside_the_api;
mod harness;
mod http_limits;
mod informer;
mod kubectl_plugin;
mod lagging_api_server;
mod leader_election;
mod manager;
mod metrics_lint;
mod missing_crd;
mod node_annotation_syncer;
mod pod_cidr_migration;
mod pod_network;
mod pod_network_flannel;
mod protobuf;
mod release_hold;
mod route_controller;
mod secure_metrics;
mod sizing;
mod split_brain;
mod subnet_allocator;
mod takeover_from_another_configuration;
mod unread_writes;
