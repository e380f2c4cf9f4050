//! An endpoint as selection weighs it: one endpoint of one service port, with the backend
//! address it would be and the conditions that decide whether it is used.
use super::model::{Endpoint, ServiceInfo, ThisNode};
use crate::desired::BackendAddr;

/// An endpoint of one service port: its backend address and what decides its use.
#[derive(Clone, Debug)]
pub(crate) struct PortEndpoint<'a> {
    pub(crate) backend: BackendAddr,
    pub(crate) endpoint: &'a Endpoint,
}

impl PortEndpoint<'_> {
    pub(super) fn ready(&self, service: &ServiceInfo) -> bool {
        self.endpoint.ready || service.publish_not_ready_addresses
    }

    pub(super) fn serving_terminating(&self) -> bool {
        self.endpoint.serving && self.endpoint.terminating
    }

    pub(super) fn is_local(&self, node: &ThisNode) -> bool {
        self.endpoint.node_name.as_deref() == Some(node.name.as_str())
    }
}
