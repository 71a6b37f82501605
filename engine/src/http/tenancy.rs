//! The tenant gate in front of `/v1/*` is `kvfabric_tenants::http::gate`
//! (shared with the router): this module gives it the API's state (its
//! [`TenantGate`]) and the API's error body for a refusal.

use kvfabric_tenants::http::{GateState, Refusal};
use kvfabric_tenants::TenantGate;

use super::openai::ApiError;
use super::state::HttpState;

impl GateState for HttpState {
    type Error = ApiError;

    fn tenant_gate(&self) -> &TenantGate {
        &self.tenants
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        ApiError {
            status: r.status,
            message: r.message,
            kind: r.kind,
            param: None,
            code: Some(r.code),
        }
    }
}
