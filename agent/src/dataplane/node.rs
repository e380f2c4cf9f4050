//! This node's settings for the programs (the TC programs' SNAT address and ports and
//! conntrack timeouts; the socket hooks' pod namespaces), and for `inspect` the socket
//! hooks' scope and the agent's network namespace, written to their maps only when they
//! change.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use socklb_abi::{
    NodeConfig, NodeConfig6, SOCKET_LB_SCOPE_ALL, SOCKET_LB_SCOPE_HOST, SOCKET_LB_SCOPE_PODS,
    map_names,
};
use tracing::{debug, info};

use super::{Dataplane, config::NodeSettings, error::DataplaneError};

impl Dataplane {
    /// Tells the socket hooks which pods' network namespaces they serve besides the host's
    /// (`--socket-lb-scope pods`); written only on change.
    pub fn set_socket_lb_namespaces(
        &mut self,
        cookies: &BTreeSet<u64>,
    ) -> Result<(), DataplaneError> {
        let wanted = cookies.iter().map(|&cookie| (cookie, 1)).collect();
        let (added, removed) = self
            .namespaces
            .set(&wanted)
            .map_err(DataplaneError::map(map_names::SOCKET_LB_NAMESPACES))?;
        if added + removed > 0 {
            debug!(
                added,
                removed,
                total = cookies.len(),
                "pods' network namespaces in the socket hooks' scope"
            );
        }
        Ok(())
    }

    /// Tells the TC programs which pod devices carry the per-packet path's programs (by
    /// interface index, with their `POD_DEVICE_*` flags): a flow delivered directly goes
    /// only to one of them, whose program takes its answers; written only on change.
    pub fn set_pod_devices(&mut self, devices: &BTreeMap<u32, u8>) -> Result<(), DataplaneError> {
        let (written, removed) = self
            .pod_devices
            .set(devices)
            .map_err(DataplaneError::map(map_names::POD_DEVICES))?;
        if written + removed > 0 {
            debug!(
                written,
                removed,
                total = devices.len(),
                "served pod devices"
            );
        }
        Ok(())
    }

    /// Tells the TC programs this node's SNAT address and ports; written only on change.
    pub fn set_node(&mut self, settings: &NodeSettings) -> Result<(), DataplaneError> {
        let wanted = NodeConfig {
            snat_address: settings.snat_address.map_or(0, |a| u32::from(a).to_be()),
            snat_port_min: *settings.snat_ports.start(),
            snat_port_max: *settings.snat_ports.end(),
            maglev_table_size: self.config.maglev_table_size,
            ct_timeout_syn_s: timeout_seconds(settings.conntrack_timeouts.tcp_syn),
            ct_timeout_established_s: timeout_seconds(settings.conntrack_timeouts.tcp_established),
            ct_timeout_closing_s: timeout_seconds(settings.conntrack_timeouts.tcp_close),
            ct_timeout_udp_s: timeout_seconds(settings.conntrack_timeouts.udp),
            socket_lb_scope: match (self.config.socket_lb_netns, self.config.socket_lb_listed) {
                (None, _) => SOCKET_LB_SCOPE_ALL,
                (Some(_), false) => SOCKET_LB_SCOPE_HOST,
                (Some(_), true) => SOCKET_LB_SCOPE_PODS,
            },
            agent_netns_cookie: self.netns_cookie,
            pod_delivery: self.config.pod_delivery.code(),
            pad: 0,
        };
        let map_error = DataplaneError::map(map_names::NODE);
        if self.node.get(&0, 0).map_err(map_error)? != wanted {
            self.node.set(0, &wanted, 0).map_err(map_error)?;
            info!(
                snat_address = %settings
                    .snat_address
                    .map_or_else(|| "none".to_owned(), |address| address.to_string()),
                snat_ports = %format!(
                    "{}-{}",
                    settings.snat_ports.start(),
                    settings.snat_ports.end()
                ),
                conntrack_timeouts = %settings.conntrack_timeouts,
                "node settings for traffic from outside written"
            );
        }
        if let Some(node6) = &mut self.node6 {
            let wanted = NodeConfig6 {
                snat_address: settings
                    .snat_address6
                    .map_or([0; 4], |a| socklb_abi::ipv6_words(a.octets())),
            };
            let map_error = DataplaneError::map(map_names::NODE6);
            if node6.get(&0, 0).map_err(map_error)? != wanted {
                node6.set(0, &wanted, 0).map_err(map_error)?;
                info!(
                    snat_address6 = ?settings.snat_address6,
                    "IPv6 node settings for traffic from outside written"
                );
            }
        }
        Ok(())
    }
}

/// Whole seconds, at least 1 (0 would mean "the default" to the programs).
fn timeout_seconds(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1)
}
