//! Objects' identities as the state keys them, and the set of them a manifest file holds,
//! kept as 128-bit hashes: 16 bytes an object where the identities took about 120 (24 MB
//! at 100,000 Services). The identities of the objects a file lost are read again from its
//! last good text, which only a deletion needs.
use xxhash_rust::xxh3::Xxh3;

use super::Object;
pub use super::manifest::ObjectId;

pub fn object_id(object: &Object) -> ObjectId {
    let metadata = object.metadata();
    let namespace = object.kind().namespace_of(metadata.namespace.as_deref());
    let name = metadata.name.clone().unwrap_or_default();
    (object.kind(), namespace, name)
}

/// A set of identities, by hash (a collision between two objects is as likely as between
/// two random 128-bit numbers).
#[derive(Debug, Default)]
pub struct ObjectIds(Box<[u128]>);

impl ObjectIds {
    /// The identities of `objects` (an object held twice counts once).
    pub fn of(objects: &[Object]) -> Self {
        Self::of_both(objects, &[])
    }

    /// The identities of `objects` and `more`.
    pub fn of_both(objects: &[Object], more: &[Object]) -> Self {
        let mut hashes: Vec<u128> = objects
            .iter()
            .chain(more)
            .map(|o| hash(&object_id(o)))
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        Self(hashes.into_boxed_slice())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, id: &ObjectId) -> bool {
        self.0.binary_search(&hash(id)).is_ok()
    }

    /// Whether every identity held here is in `other` too.
    pub fn all_in(&self, other: &Self) -> bool {
        self.0.iter().all(|h| other.0.binary_search(h).is_ok())
    }
}

/// Where each identity was met last, by its hash and the index of a file: a first read's,
/// to name the copy an object defined twice replaces (about 40 bytes an object, for as long
/// as the read lasts).
#[derive(Debug, Default)]
pub struct Seen(std::collections::HashMap<u128, usize>);

impl Seen {
    /// Notes `id` in the file at `file`; returns the file it was met in before, if any.
    pub fn met(&mut self, id: &ObjectId, file: usize) -> Option<usize> {
        self.0.insert(hash(id), file)
    }
}

/// The identities of `objects` (the ones this set was made of) that are not in `now`.
pub fn lost(objects: &[Object], now: &ObjectIds) -> Vec<ObjectId> {
    let mut lost: Vec<ObjectId> = objects
        .iter()
        .map(object_id)
        .filter(|id| !now.contains(id))
        .collect();
    lost.sort_unstable();
    lost.dedup();
    lost
}

fn hash((kind, namespace, name): &ObjectId) -> u128 {
    let mut hasher = Xxh3::new();
    // The lengths keep ("ab", "c") apart from ("a", "bc").
    hasher.update(&[*kind as u8]);
    hasher.update(&(namespace.len() as u64).to_le_bytes());
    hasher.update(namespace.as_bytes());
    hasher.update(name.as_bytes());
    hasher.digest128()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::source::{Kind, manifest::parse};

    fn objects(text: &str) -> Vec<Object> {
        parse(Path::new("x.yaml"), text).expect("parse")
    }

    const TWO: &str = "\
kind: Service
metadata: {name: web}
---
kind: Node
metadata: {name: web, namespace: ignored}
";

    #[test]
    fn identities_differ_by_kind_namespace_and_name() {
        let ids = ObjectIds::of(&objects(TWO));
        assert_eq!(ids.len(), 2);
        let service = (Kind::Service, "default".to_owned(), "web".to_owned());
        let node = (Kind::Node, String::new(), "web".to_owned());
        assert!(ids.contains(&service) && ids.contains(&node));
        assert!(!ids.contains(&(Kind::Service, "defaul".to_owned(), "tweb".to_owned())));
        assert!(!ids.contains(&(Kind::EndpointSlice, "default".to_owned(), "web".to_owned())));
    }

    #[test]
    fn what_a_file_lost_is_named_from_its_old_objects() {
        let old = objects(&format!(
            "{TWO}---\nkind: Service\nmetadata: {{name: web}}\n"
        ));
        let old_ids = ObjectIds::of(&old);
        assert_eq!(old_ids.len(), 2, "an object held twice counts once");
        let now = ObjectIds::of(&objects("kind: Node\nmetadata: {name: web}\n"));
        assert!(!old_ids.all_in(&now));
        assert!(now.all_in(&old_ids));
        assert_eq!(
            lost(&old, &now),
            [(Kind::Service, "default".to_owned(), "web".to_owned())]
        );
        assert!(lost(&old, &old_ids).is_empty());
    }
}
