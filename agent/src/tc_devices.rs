//! Which devices the TC programs serve, kept in step with the node: its external devices
//! (those that hold the Node's addresses, or `--devices`) take traffic from outside, and
//! the workloads' devices (`--pod-devices`) take the per-packet path. Pods come and go, so
//! the set is worked out again at every sync and whenever links change, and only the
//! devices that are new get programs.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use socklb_abi::POD_DEVICE_VETH;
use tracing::{info, warn};

use crate::{
    dataplane::{
        self, Dataplane, DataplaneError, DeviceError, DeviceRole, PodDevices, TcDevice, TcMode,
        ipv4_forwarding, ipv6_forwarding,
    },
    select::{Family, ThisNode},
};

/// The devices served and what is known about the others.
pub struct TcDevices {
    /// `--devices`: empty means the devices that hold this Node's addresses.
    external: Vec<String>,
    pods: PodDevices,
    mode: TcMode,
    /// What the programs are attached to (`None`: nothing yet by this agent).
    served: Option<Vec<TcDevice>>,
    /// Devices holding the Node's addresses that are not Ethernet, skipped with a warning
    /// logged once each.
    refused: BTreeSet<String>,
    /// Pod devices that could not be served or found, logged once each.
    unserved_pods: BTreeSet<String>,
    /// Each link's interface index and `POD_DEVICE_*` flags at the last listing.
    links: BTreeMap<String, (u32, u8)>,
    /// The served pod devices' map could not be written (logged once).
    pod_devices_unwritten: bool,
}

impl TcDevices {
    pub fn new(external: Vec<String>, pods: PodDevices, mode: TcMode) -> Self {
        Self {
            external,
            pods,
            mode,
            served: None,
            refused: BTreeSet::new(),
            unserved_pods: BTreeSet::new(),
            links: BTreeMap::new(),
            pod_devices_unwritten: false,
        }
    }

    /// Attaches the programs to the devices that need them now and detaches them from
    /// those that no longer do. `local` is what this namespace's devices hold.
    pub fn program(
        &mut self,
        dataplane: &mut Dataplane,
        node: &ThisNode,
        local: Vec<(IpAddr, String)>,
    ) -> Result<(), DataplaneError> {
        let external = self.external_devices(node, local);
        let pods = self.pod_devices(&external);
        let wanted: Vec<TcDevice> = external
            .iter()
            .map(|device| (device.clone(), DeviceRole::External))
            .chain(pods.into_iter().map(|device| (device, DeviceRole::Pod)))
            .collect();
        if self.served.as_ref() == Some(&wanted) {
            self.tell_pod_devices(dataplane);
            return Ok(());
        }
        let externals_changed = self.served.as_ref().is_none_or(|served| {
            !served
                .iter()
                .filter(|(_, role)| *role == DeviceRole::External)
                .map(|(device, _)| device)
                .eq(external.iter())
        });
        if externals_changed {
            warn_unservable(node, &external);
        }
        let done = self.served.take().unwrap_or_default();
        let outcome = dataplane.attach_tc(&wanted, &done, self.mode)?;
        for (device, error) in outcome.failed {
            if self.unserved_pods.insert(device.clone()) {
                warn!(
                    device,
                    error = %crate::error_chain(&error),
                    "cannot attach the per-packet path to this pod device: its workload's \
                     packets to ClusterIPs are not translated per packet (its sockets still \
                     are, where the socket hooks reach them)"
                );
            }
        }
        self.unserved_pods
            .retain(|device| wanted.iter().any(|(wanted, _)| wanted == device));
        self.served = Some(outcome.devices);
        self.tell_pod_devices(dataplane);
        Ok(())
    }

    /// Tells the programs which devices carry the pod program, the only ones a flow
    /// delivered directly is redirected to (an index can change with no change of names: a
    /// pod's device made again under its name). Where the map cannot be written, such
    /// flows to the devices it lacks take the kernel's path: logged, not an error of the sync.
    fn tell_pod_devices(&mut self, dataplane: &mut Dataplane) {
        let devices = self
            .served_pod_devices()
            .iter()
            .filter_map(|device| self.links.get(device).copied())
            .collect();
        match dataplane.set_pod_devices(&devices) {
            Ok(()) => self.pod_devices_unwritten = false,
            Err(error) if !self.pod_devices_unwritten => {
                self.pod_devices_unwritten = true;
                warn!(
                    error = %crate::error_chain(&error),
                    "cannot list the served pod devices for the programs: flows delivered \
                     directly to the devices missing there take the kernel's path"
                );
            }
            Err(_) => {}
        }
    }

    /// The pod devices the per-packet path's programs are attached to now.
    pub fn served_pod_devices(&self) -> Vec<String> {
        self.served
            .iter()
            .flatten()
            .filter(|(_, role)| *role == DeviceRole::Pod)
            .map(|(device, _)| device.clone())
            .collect()
    }

    fn external_devices(&mut self, node: &ThisNode, local: Vec<(IpAddr, String)>) -> Vec<String> {
        if !self.external.is_empty() {
            return self.external.clone();
        }
        let devices: BTreeSet<String> = local
            .into_iter()
            .filter(|(address, _)| node.addresses.contains(address))
            .map(|(_, device)| device)
            .collect();
        devices
            .into_iter()
            .filter(|device| servable(device, &mut self.refused))
            .collect()
    }

    /// The pod devices present now; none if the links cannot be listed (logged).
    fn pod_devices(&mut self, external: &[String]) -> Vec<String> {
        if self.pods == PodDevices::None {
            return Vec::new();
        }
        let links = match dataplane::links() {
            Ok(links) => links,
            Err(error) => {
                warn!(%error, "cannot list the network devices: the per-packet path keeps the pod devices it has");
                return self.served_pod_devices();
            }
        };
        self.links = links
            .iter()
            .map(|link| {
                let flags = if link.workload_veth {
                    POD_DEVICE_VETH
                } else {
                    0
                };
                (link.name.clone(), (link.index, flags))
            })
            .collect();
        for device in self.pods.missing(&links) {
            if self.unserved_pods.insert(device.clone()) {
                warn!(
                    device,
                    "--pod-devices names a device this network namespace does not have: it is \
                     served once it appears"
                );
            }
        }
        self.pods.select(&links, external)
    }
}

/// Whether the TC programs can serve `device`, a device found from the Node's addresses.
/// One that is not Ethernet is skipped, with a warning the first time; one whose link
/// type cannot be read is tried (attaching then says what is wrong).
fn servable(device: &str, refused: &mut BTreeSet<String>) -> bool {
    match dataplane::check_ethernet(device) {
        Err(error @ DeviceError::NotEthernet { .. }) => {
            if refused.insert(device.to_owned()) {
                warn!(
                    device,
                    error = %error,
                    "skipping a device that holds this Node's addresses: traffic from \
                     outside arriving on it is not translated"
                );
            }
            false
        }
        _ => true,
    }
}

/// What keeps traffic from outside from being served on `devices`, said when they change.
fn warn_unservable(node: &ThisNode, devices: &[String]) {
    if devices.is_empty() {
        warn!(
            addresses = %crate::listed(&node.addresses),
            "no device holds this Node's addresses: traffic from outside the node is not \
             translated; pass --devices"
        );
        return;
    }
    let listed = crate::listed(devices);
    info!(devices = %listed, "external devices");
    if ipv4_forwarding() == Some(false) {
        warn!(
            devices = %listed,
            "net.ipv4.ip_forward is 0: NodePort, LoadBalancer and externalIP traffic cannot \
             reach any pod (kube-proxy needs it too); run `sysctl -w net.ipv4.ip_forward=1` \
             on the node, or let the CNI set it"
        );
    }
    if node.addresses_of(Family::V6).next().is_some() && ipv6_forwarding() == Some(false) {
        warn!(
            devices = %listed,
            "net.ipv6.conf.all.forwarding is 0: IPv6 NodePort, LoadBalancer and externalIP \
             traffic cannot reach any pod; run `sysctl -w net.ipv6.conf.all.forwarding=1` \
             on the node, or let the CNI set it"
        );
    }
}
