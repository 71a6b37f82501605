//! Prometheus text exposition of a registry: GET /metrics and the console's
//! history ring read the same text.

use prometheus_client::registry::Registry;

/// Prometheus text exposition of `registry`.
pub fn encode_text(registry: &Registry) -> String {
    let mut s = String::new();
    if prometheus_client::encoding::text::encode(&mut s, registry).is_err() {
        tracing::error!("metrics encoding failed");
    }
    s
}
