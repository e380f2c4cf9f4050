//! The desired datapath, assembled from each Service's selection, and which frontends a
//! change of one Service touches, so that a sync writes only those.
use std::collections::{BTreeMap, BTreeSet};

use tracing::warn;

use crate::{
    desired::{Desired, Frontend, FrontendSpec, Scope},
    select::{Family, FrontendChoice, ServiceName, ServiceSelection},
};

#[derive(Debug, Default)]
pub struct FrontendTable {
    selections: BTreeMap<ServiceName, ServiceSelection>,
    /// Services claiming each frontend, sorted by claim: two Services may claim one address
    /// and port (an externalIP listed twice, or equal to a ClusterIP); the first claim wins
    /// ([`claim_rank`](crate::select::FrontendKind::claim_rank), then namespace/name), the same on every node.
    /// A Vec, not a set: almost always one Service, and a set's node takes half a kilobyte.
    owners: BTreeMap<Frontend, Vec<Claim>>,
    /// Services with a healthCheckNodePort, so that a sync need not walk every selection.
    health_checked: BTreeSet<ServiceName>,
    /// Frontends claimed, by family and scope, kept up to date for the metrics (a sync
    /// need not count them).
    counts: BTreeMap<(Family, Scope), usize>,
}

/// A Service's claim of a frontend: its rank ([`claim_rank`](crate::select::FrontendKind::claim_rank)), then its name.
type Claim = (u8, ServiceName);

fn count_key(frontend: &Frontend) -> (Family, Scope) {
    (Family::of(frontend.address), frontend.scope)
}

impl FrontendTable {
    /// Replaces a Service's selection (`None`: gone or not served) and returns the
    /// frontends whose programming may have changed.
    pub fn update(
        &mut self,
        service: &ServiceName,
        selection: Option<ServiceSelection>,
    ) -> BTreeSet<Frontend> {
        let mut touched = BTreeSet::new();
        if let Some(old) = self.selections.remove(service) {
            for choice in &old.frontends {
                touched.insert(choice.frontend);
                if let Some(owners) = self.owners.get_mut(&choice.frontend) {
                    let claim = (choice.kind.claim_rank(), service.clone());
                    if let Ok(at) = owners.binary_search(&claim) {
                        owners.remove(at);
                    }
                    if owners.is_empty() {
                        self.owners.remove(&choice.frontend);
                        if let Some(count) = self.counts.get_mut(&count_key(&choice.frontend)) {
                            *count = count.saturating_sub(1);
                        }
                    }
                }
            }
        }
        self.health_checked.remove(service);
        if let Some(selection) = selection {
            if selection.health_check.is_some() {
                self.health_checked.insert(service.clone());
            }
            for choice in &selection.frontends {
                touched.insert(choice.frontend);
                let owners = self.owners.entry(choice.frontend).or_default();
                if owners.is_empty() {
                    *self.counts.entry(count_key(&choice.frontend)).or_default() += 1;
                }
                let claim = (choice.kind.claim_rank(), service.clone());
                if let Err(at) = owners.binary_search(&claim) {
                    // Most frontends have one owner: no room for four.
                    owners.reserve_exact(1);
                    owners.insert(at, claim);
                }
                if owners.len() == 2 {
                    warn!(
                        frontend = %choice.frontend,
                        services = %crate::listed(owners.iter().map(|(_, service)| service)),
                        "several Services claim one frontend; the first claim is used (a \
                         ClusterIP or NodePort, then a LoadBalancer IP, then an externalIP; the \
                         first by namespace/name among equals)"
                    );
                }
            }
            self.selections.insert(service.clone(), selection);
        }
        touched
    }

    /// The frontend's programming: its winning Service's choice, or `None` if no Service
    /// claims it any more.
    pub fn choice(&self, frontend: &Frontend) -> Option<&FrontendChoice> {
        let (_, owner) = self.owners.get(frontend)?.first()?;
        self.choice_of(owner, frontend)
    }

    /// `owner`'s choice for `frontend`.
    fn choice_of(&self, owner: &ServiceName, frontend: &Frontend) -> Option<&FrontendChoice> {
        self.selections
            .get(owner)?
            .frontends
            .iter()
            .find(|choice| choice.frontend == *frontend)
    }

    /// The Service whose choice programs the frontend.
    pub fn owner(&self, frontend: &Frontend) -> Option<&ServiceName> {
        self.owners.get(frontend)?.first().map(|(_, owner)| owner)
    }

    /// Every frontend some Service claims.
    pub fn frontends(&self) -> impl Iterator<Item = &Frontend> {
        self.owners.keys()
    }

    pub fn spec(&self, frontend: &Frontend) -> Option<&FrontendSpec> {
        self.choice(frontend).map(|choice| &choice.spec)
    }

    /// Every frontend: what a full resync programs.
    pub fn desired(&self) -> Desired<'_> {
        let mut desired = Desired::default();
        for (frontend, owners) in &self.owners {
            if let Some(choice) = owners
                .first()
                .and_then(|(_, owner)| self.choice_of(owner, frontend))
            {
                desired.borrow(*frontend, &choice.spec);
            }
        }
        desired
    }

    /// How many frontends are claimed, per family and scope (every pair, zeros included).
    pub fn counts(&self) -> impl Iterator<Item = (Family, Scope, usize)> + '_ {
        Family::ALL.into_iter().flat_map(move |family| {
            [Scope::Internal, Scope::External]
                .into_iter()
                .map(move |scope| {
                    let count = self.counts.get(&(family, scope)).copied().unwrap_or(0);
                    (family, scope, count)
                })
        })
    }

    /// The selections of the Services with a healthCheckNodePort.
    pub fn health_checked(&self) -> impl Iterator<Item = &ServiceSelection> {
        self.health_checked
            .iter()
            .filter_map(|name| self.selections.get(name))
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        desired::{BackendAddr, Protocol, Scope},
        select::{FrontendKind, Policy, Topology, Why},
    };

    fn service(name: &str) -> ServiceName {
        ServiceName {
            namespace: "default".to_owned(),
            name: name.to_owned(),
        }
    }

    fn selection(name: &str, frontends: &[(u8, u8)]) -> ServiceSelection {
        ServiceSelection {
            service: service(name),
            frontends: frontends
                .iter()
                .map(|(vip, backend)| FrontendChoice {
                    frontend: frontend(*vip),
                    family: crate::select::Family::V4,
                    kind: FrontendKind::ExternalIp,
                    port_name: String::new(),
                    spec: FrontendSpec {
                        backends: vec![BackendAddr::local(Ipv4Addr::new(10, 0, 0, *backend), 80)],
                        affinity_timeout_seconds: None,
                        source_ranges: None,
                        maglev: false,
                        no_endpoints: false,
                    },
                    why: Why {
                        policy: Policy::Cluster,
                        topology: Topology::None,
                        terminating_fallback: false,
                    },
                    refused: None,
                })
                .collect(),
            skipped: Vec::new(),
            health_check: None,
        }
    }

    fn frontend(last: u8) -> Frontend {
        Frontend::internal(Ipv4Addr::new(203, 0, 113, last), 80, Protocol::Tcp)
    }

    fn backend_of(table: &FrontendTable, vip: u8) -> Option<u8> {
        table
            .spec(&frontend(vip))
            .map(|spec| spec.backends[0].last_octet())
    }

    #[test]
    fn touched_frontends_cover_old_and_new() {
        let mut table = FrontendTable::default();
        table.update(&service("a"), Some(selection("a", &[(1, 1), (2, 1)])));
        let touched = table.update(&service("a"), Some(selection("a", &[(2, 2), (3, 2)])));
        assert_eq!(
            touched,
            BTreeSet::from([frontend(1), frontend(2), frontend(3)])
        );
        assert_eq!(backend_of(&table, 1), None);
        assert_eq!(backend_of(&table, 2), Some(2));
        let touched = table.update(&service("a"), None);
        assert_eq!(touched, BTreeSet::from([frontend(2), frontend(3)]));
        assert!(table.desired().frontends.is_empty());
    }

    #[test]
    fn frontends_are_counted_by_family_and_scope_once_whoever_claims_them() {
        let mut table = FrontendTable::default();
        let count = |table: &FrontendTable, family| {
            table
                .counts()
                .find(|(f, scope, _)| *f == family && *scope == Scope::Internal)
                .map(|(_, _, n)| n)
        };
        table.update(&service("a"), Some(selection("a", &[(1, 1), (2, 1)])));
        table.update(&service("b"), Some(selection("b", &[(2, 2)])));
        let mut v6 = selection("c", &[(3, 1)]);
        v6.frontends[0].frontend.address = "fd00:96::3".parse().expect("address");
        table.update(&service("c"), Some(v6));
        assert_eq!(count(&table, Family::V4), Some(2));
        assert_eq!(count(&table, Family::V6), Some(1));
        table.update(&service("a"), None);
        assert_eq!(count(&table, Family::V4), Some(1), "b still claims 2");
        table.update(&service("b"), None);
        table.update(&service("c"), None);
        assert!(table.counts().all(|(_, _, n)| n == 0));
    }

    #[test]
    fn a_frontend_claimed_twice_goes_to_the_first_service_by_name_until_it_leaves() {
        let mut table = FrontendTable::default();
        table.update(&service("b"), Some(selection("b", &[(1, 2)])));
        table.update(&service("a"), Some(selection("a", &[(1, 1)])));
        assert_eq!(backend_of(&table, 1), Some(1));
        table.update(&service("a"), None);
        assert_eq!(backend_of(&table, 1), Some(2));
    }

    #[test]
    fn a_cluster_ip_outranks_an_external_ip_whatever_the_names() {
        let mut table = FrontendTable::default();
        let mut dns = selection("dns", &[(1, 1)]);
        dns.frontends[0].kind = FrontendKind::ClusterIp;
        // "aaa" sorts first, and lists the ClusterIP as an externalIP of its own.
        table.update(&service("aaa"), Some(selection("aaa", &[(1, 2)])));
        table.update(&service("dns"), Some(dns));
        assert_eq!(backend_of(&table, 1), Some(1));
        assert_eq!(table.owner(&frontend(1)), Some(&service("dns")));
        table.update(&service("dns"), None);
        assert_eq!(backend_of(&table, 1), Some(2));
    }
}
