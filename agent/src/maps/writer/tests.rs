//! The writer's table tests: every apply's writes, checked after every single write as a
//! concurrent lookup would see them (`recorder`).
use std::net::Ipv4Addr;

use super::{
    recorder::{Recorder, assert_consistent},
    *,
};

/// The count of a test frontend's master entry.
fn master_count(w: &Writer<Recorder>, last: u8) -> u16 {
    match w.store.services[&service_key(&frontend(last), 0)] {
        SlotValue::Master(master) => master.count,
        SlotValue::Backend { .. } => panic!("slot 0 holds a backend"),
    }
}

const CAPACITY: Capacity = Capacity::both(Room {
    service_entries: 1000,
    backends: 1000,
});

fn frontend(last: u8) -> Frontend {
    Frontend::internal(Ipv4Addr::new(10, 96, 0, last), 80, Protocol::Tcp)
}

fn backends(lasts: &[u8]) -> Vec<BackendAddr> {
    lasts
        .iter()
        .map(|last| BackendAddr::local(Ipv4Addr::new(10, 0, 0, *last), 8080))
        .collect()
}

fn desired(entries: &[(u8, &[u8])]) -> Desired<'static> {
    let mut desired = Desired::default();
    for (f, b) in entries {
        desired.insert(
            frontend(*f),
            FrontendSpec {
                backends: backends(b),
                affinity_timeout_seconds: None,
                source_ranges: None,
                maglev: false,
                no_endpoints: false,
            },
        );
    }
    desired
}

/// The writes of the next apply when nothing changed: the deletions it catches up on.
fn next_apply(w: &mut Writer<Recorder>) -> Vec<String> {
    w.store.ops.clear();
    w.apply_changes(&BTreeMap::new()).expect("apply");
    kinds(&w.store.ops)
}

fn writer() -> Writer<Recorder> {
    Writer::adopt(Recorder::default(), CAPACITY, MapContents::default())
}

/// An empty writer with room for `service_entries` and `backends`.
fn sized_writer(service_entries: u32, backends: u32) -> Writer<Recorder> {
    Writer::adopt(
        Recorder::default(),
        Capacity::both(Room {
            service_entries,
            backends,
        }),
        MapContents::default(),
    )
}

fn kinds(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .map(|op| match op {
            Op::PutBackend { id, .. } => format!("+be{id}"),
            Op::DeleteBackend { id, .. } => format!("-be{id}"),
            Op::PutService {
                value: SlotValue::Master(master),
                ..
            } => format!("+master(count={})", master.count),
            Op::PutService {
                key,
                value: SlotValue::Backend { id, .. },
            } => format!("+slot{}=be{id}", key.slot),
            Op::DeleteService { key } if key.slot == 0 => "-master".to_owned(),
            Op::DeleteService { key } => format!("-slot{}", key.slot),
            Op::DeleteStray { key } => format!("-stray{key:?}"),
        })
        .collect()
}

#[test]
fn new_frontend_writes_backends_then_slots_then_master() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
    assert_eq!(
        kinds(&w.store.ops),
        [
            "+be1",
            "+be2",
            "+slot1=be1",
            "+slot2=be2",
            "+master(count=2)"
        ]
    );
}

#[test]
fn unchanged_desired_writes_nothing() {
    let mut w = writer();
    let d = desired(&[(1, &[1, 2]), (2, &[])]);
    w.apply(&d).expect("apply");
    let report = w.apply(&d).expect("apply");
    assert_eq!(report.writes, 0);
}

#[test]
fn shrink_lowers_count_and_deletes_the_slots_above_it_one_apply_later() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
    w.store.ops.clear();
    w.apply(&desired(&[(1, &[1, 3])])).expect("apply");
    // Slot 3 stays for a lookup that read count 3 (it names be3, which stays).
    assert_eq!(
        kinds(&w.store.ops),
        ["+slot2=be3", "+master(count=2)", "-be2"]
    );
    assert_eq!(w.service_entries() as usize, w.store.services.len());
    assert_eq!(next_apply(&mut w), ["-slot3"]);
}

#[test]
fn replacing_the_whole_set_never_exposes_a_missing_backend() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
    w.store.ops.clear();
    w.apply(&desired(&[(1, &[4, 5])])).expect("apply");
    assert_eq!(
        kinds(&w.store.ops),
        [
            "+be4",
            "+be5",
            "+slot1=be4",
            "+slot2=be5",
            "+master(count=2)",
            "-be1",
            "-be2",
            "-be3"
        ]
    );
    assert_eq!(next_apply(&mut w), ["-slot3"]);
}

#[test]
fn removed_frontend_loses_master_before_slots() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
    w.store.ops.clear();
    w.apply(&desired(&[])).expect("apply");
    assert_eq!(kinds(&w.store.ops), ["-master", "-be1", "-be2"]);
    assert_eq!(next_apply(&mut w), ["-slot1", "-slot2"]);
    assert!(w.store.services.is_empty());
    assert_eq!(w.service_entries(), 0);
}

#[test]
fn no_backends_keeps_a_master_with_count_zero() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1])])).expect("apply");
    w.store.ops.clear();
    w.apply(&desired(&[(1, &[])])).expect("apply");
    assert_eq!(kinds(&w.store.ops), ["+master(count=0)", "-be1"]);
    assert_eq!(next_apply(&mut w), ["-slot1"]);
}

#[test]
fn shared_backend_is_written_once_and_kept_while_used() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1]), (2, &[1])])).expect("apply");
    assert_eq!(w.store.backends.len(), 1);
    w.store.ops.clear();
    w.apply(&desired(&[(2, &[1])])).expect("apply");
    assert_eq!(kinds(&w.store.ops), ["-master"]);
}

#[test]
fn a_remote_backend_is_flagged_in_its_slot_and_survives_adoption() {
    let mut w = writer();
    let mut d = desired(&[(1, &[1, 2])]);
    for spec in d.frontends.values_mut() {
        spec.to_mut().backends[1].remote = true;
    }
    w.apply(&d).expect("apply");
    let remote: Vec<bool> = (1..=2)
        .map(
            |slot| match w.store.services[&service_key(&frontend(1), slot)] {
                SlotValue::Backend { backend, .. } => backend.remote,
                SlotValue::Master(_) => panic!("slot {slot} holds a master"),
            },
        )
        .collect();
    assert_eq!(remote, [false, true]);
    let contents = w.store.contents();
    let recorder = Recorder {
        services: w.store.services.clone(),
        backends: w.store.backends.clone(),
        ..Recorder::default()
    };
    let mut adopted = Writer::adopt(recorder, CAPACITY, contents);
    assert_eq!(adopted.apply(&d).expect("apply").writes, 0);
}

#[test]
fn affinity_change_rewrites_only_the_master() {
    let mut w = writer();
    let mut d = desired(&[(1, &[1])]);
    w.apply(&d).expect("apply");
    w.store.ops.clear();
    d.frontends
        .get_mut(&frontend(1))
        .expect("frontend")
        .to_mut()
        .affinity_timeout_seconds = Some(30);
    w.apply(&d).expect("apply");
    assert_eq!(kinds(&w.store.ops), ["+master(count=1)"]);
    let SlotValue::Master(master) = w.store.services[&service_key(&frontend(1), 0)] else {
        panic!("no master");
    };
    assert_eq!(master.flags, SERVICE_FLAG_AFFINITY);
    assert_eq!(master.affinity_timeout_s, 30);
}

#[test]
fn adopting_the_maps_makes_a_restart_write_nothing() {
    let mut first = writer();
    let d = desired(&[(1, &[1, 2, 3]), (2, &[2]), (3, &[])]);
    first.apply(&d).expect("apply");
    let contents = first.store.contents();
    let recorder = Recorder {
        services: first.store.services.clone(),
        backends: first.store.backends.clone(),
        ..Recorder::default()
    };
    let mut second = Writer::adopt(recorder, CAPACITY, contents);
    let report = second.apply(&d).expect("apply");
    assert_eq!(report.writes, 0, "{:?}", kinds(&second.store.ops));
}

#[test]
fn adopting_repairs_strays_orphans_holes_and_edited_slots() {
    let f = frontend(1);
    let backend = |id: u32| BackendAddr::local(Ipv4Addr::new(10, 0, 0, id as u8), 8080);
    let slot = |id: u32, backend: BackendAddr| SlotValue::Backend { id, backend };
    let master = SlotValue::Master(Master {
        count: 3,
        service_id: 7,
        ..Master::default()
    });
    let stray = StrayKey::V4(socklb_abi::ServiceKey {
        protocol: 99,
        ..socklb_abi::ServiceKey::default()
    });
    let contents = MapContents {
        services: vec![
            (service_key(&f, 0), master),
            (service_key(&f, 1), slot(1, backend(1))),
            // slot 2 missing (a hole), slot 3 edited by hand (wrong port)
            (
                service_key(&f, 3),
                slot(
                    3,
                    BackendAddr {
                        port: 9999,
                        ..backend(3)
                    },
                ),
            ),
            // above the count
            (service_key(&f, 5), slot(2, backend(2))),
            // an orphan slot of a frontend without master
            (service_key(&frontend(9), 1), slot(1, backend(1))),
        ],
        // a key of a protocol this agent does not know
        strays: vec![stray],
        backends: (1..=3)
            .map(|id| (id, backend(id), Some(Protocol::Tcp)))
            .collect(),
    };
    // The adopted maps are inconsistent on purpose: check only the end state.
    let recorder = Recorder {
        services: contents.services.iter().copied().collect(),
        backends: contents
            .backends
            .iter()
            .map(|(id, addr, _)| (*id, (*addr, Protocol::Tcp)))
            .collect(),
        check_every_write: false,
        ..Recorder::default()
    };
    let mut w = Writer::adopt(recorder, CAPACITY, contents);
    w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
    assert!(w.store.ops.contains(&Op::DeleteStray { key: stray }));
    assert_consistent(&w.store.services, &w.store.backends);
    let slots: Vec<_> = w
        .store
        .services
        .keys()
        .map(|k| (k.frontend, k.slot))
        .collect();
    assert_eq!(slots, [(f, 0), (f, 1), (f, 2), (f, 3)]);
    let SlotValue::Master(master) = w.store.services[&service_key(&f, 0)] else {
        panic!("no master");
    };
    assert_eq!(master.service_id, 7);
    assert_eq!(w.store.services[&service_key(&f, 3)], slot(3, backend(3)));
    assert_eq!(w.store.backends.len(), 3);
    assert_eq!(w.service_entries() as usize, w.store.services.len());
}

#[test]
fn partial_changes_touch_only_the_named_frontends() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2]), (2, &[2, 3])]))
        .expect("apply");
    w.store.ops.clear();
    let spec = FrontendSpec {
        backends: backends(&[3]),
        affinity_timeout_seconds: None,
        source_ranges: None,
        maglev: false,
        no_endpoints: false,
    };
    // Frontend 1 now uses backend 3 only; frontend 3 is removed (never existed: no-op).
    let changes = BTreeMap::from([(frontend(1), Some(&spec)), (frontend(3), None)]);
    w.apply_changes(&changes).expect("apply");
    // Backend 2 is still used by frontend 2; backend 1 is not used any more.
    assert_eq!(
        kinds(&w.store.ops),
        ["+slot1=be3", "+master(count=1)", "-be1"]
    );
    assert_eq!(w.store.backends.len(), 2);
}

#[test]
fn entry_accounting_matches_the_maps_through_changes() {
    let mut w = writer();
    let steps: [&[(u8, &[u8])]; 5] = [
        &[(1, &[1, 2, 3]), (2, &[2])],
        &[(1, &[1]), (2, &[2, 3, 4]), (3, &[])],
        &[(3, &[5, 6])],
        &[],
        &[(4, &[1, 2, 3, 4, 5, 6])],
    ];
    for step in steps {
        w.apply(&desired(step)).expect("apply");
        // The entries held, a frontend with a master counting at least two.
        let mut per_frontend: BTreeMap<Frontend, (bool, usize)> = BTreeMap::new();
        for key in w.store.services.keys() {
            let (master, entries) = per_frontend.entry(key.frontend).or_default();
            *master |= key.slot == 0;
            *entries += 1;
        }
        let accounted = per_frontend
            .values()
            .map(|(master, entries)| if *master { (*entries).max(2) } else { *entries })
            .sum::<usize>();
        assert_eq!(w.service_entries() as usize, accounted, "{step:?}");
        assert_eq!(
            w.backend_entries() as usize,
            w.store.backends.len(),
            "{step:?}"
        );
    }
}

#[test]
fn a_change_that_does_not_fit_leaves_the_frontend_as_it_was() {
    let mut w = sized_writer(5, 10);
    w.apply(&desired(&[(1, &[1, 2]), (2, &[])])).expect("apply");
    let before = w.store.services.clone();
    let report = w
        .apply(&desired(&[(1, &[1, 2, 3, 4]), (2, &[])]))
        .expect("apply");
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    let message = report.rejected[0].to_string();
    assert!(message.contains("socklb_svc_v3"), "{message}");
    assert!(message.contains("--max-service-entries"), "{message}");
    assert!(message.contains("keeps its previous state"), "{message}");
    assert_eq!(w.store.services, before);
    assert!(!w.store.backends.contains_key(&3));
}

#[test]
fn programmed_frontends_get_the_room_and_a_new_one_that_does_not_fit_is_refused() {
    let mut w = sized_writer(7, 10);
    w.apply(&desired(&[(2, &[1, 2])])).expect("apply");
    // Frontend 1 sorts first but is new: frontend 2, programmed, grows first.
    let report = w
        .apply(&desired(&[(1, &[5, 6]), (2, &[1, 2, 3, 4])]))
        .expect("apply");
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    assert_eq!(report.rejected[0].frontend(), frontend(1));
    let message = report.rejected[0].to_string();
    assert!(message.contains("refused until it fits"), "{message}");
    assert_eq!(master_count(&w, 2), 4);
    // Frontend 1 refuses connections (count 0) instead of leaving its VIP untranslated.
    assert_eq!(master_count(&w, 1), 0);
    // Once there is room, it is programmed in full.
    w.apply(&desired(&[(1, &[5, 6]), (2, &[1])]))
        .expect("apply");
    let report = w
        .apply(&desired(&[(1, &[5, 6]), (2, &[1])]))
        .expect("apply");
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    assert_eq!(master_count(&w, 1), 2);
}

/// The writer's count of rejected frontends is the current state: a frontend rejected
/// by an earlier apply stays counted through applies that do not touch it, and leaves
/// the count when it fits, is removed, or is no longer desired.
#[test]
fn rejected_frontends_are_counted_until_they_fit_or_go() {
    let mut w = sized_writer(5, 10);
    let count = |w: &Writer<Recorder>, outcome: Outcome| {
        w.rejected()
            .into_iter()
            .find_map(|(o, n)| (o == outcome).then_some(n))
            .expect("every outcome")
    };
    w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
    let wanted = desired(&[(1, &[1, 2, 3, 4, 5, 6]), (2, &[5, 7]), (3, &[6])]);
    let spec = |f: u8| wanted.frontends.get(&frontend(f)).map(|spec| &**spec);
    // Frontend 1 cannot grow (kept), frontend 2 gets a master only (refused).
    let report = w
        .apply_changes(&BTreeMap::from([
            (frontend(1), spec(1)),
            (frontend(2), spec(2)),
        ]))
        .expect("apply");
    assert_eq!(report.rejected.len(), 2, "{:?}", report.rejected);
    assert_eq!(count(&w, Outcome::KeptPrevious), 1);
    assert_eq!(count(&w, Outcome::Refused), 1);
    // An apply of another frontend only: the two above are still not programmed.
    let report = w
        .apply_changes(&BTreeMap::from([(frontend(3), spec(3))]))
        .expect("apply");
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    assert_eq!(count(&w, Outcome::KeptPrevious), 1);
    assert_eq!(count(&w, Outcome::Refused), 1);
    assert_eq!(count(&w, Outcome::NotProgrammed), 1);
    // Retried, the refused frontend still does not fit: kept as it was, which is refusing.
    w.apply_changes(&BTreeMap::from([(frontend(2), spec(2))]))
        .expect("apply");
    assert_eq!(count(&w, Outcome::Refused), 1);
    assert_eq!(count(&w, Outcome::KeptPrevious), 1);
    // Frontend 2 removed; frontend 3 no longer desired at a full apply.
    w.apply_changes(&BTreeMap::from([(frontend(2), None)]))
        .expect("apply");
    assert_eq!(count(&w, Outcome::Refused), 0);
    assert_eq!(count(&w, Outcome::NotProgrammed), 1);
    let report = w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    assert_eq!(
        w.rejected().map(|(_, n)| n),
        [0, 0, 0],
        "frontend 1 fits now"
    );
}

#[test]
fn a_new_frontend_without_room_even_for_its_master_says_it_is_untranslated() {
    let mut w = sized_writer(3, 10);
    w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
    let report = w
        .apply(&desired(&[(1, &[1, 2]), (2, &[3])]))
        .expect("apply");
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    assert_eq!(report.rejected[0].outcome(), Outcome::NotProgrammed);
    assert!(
        report.rejected[0].to_string().contains("not translated"),
        "{}",
        report.rejected[0]
    );
    assert!(!w.store.services.contains_key(&service_key(&frontend(2), 0)));
}

#[test]
fn preferred_frontends_get_the_room_before_other_new_ones() {
    let mut w = sized_writer(4, 10);
    // As after the maps were replaced: frontend 2 was programmed in the old ones.
    w.prefer([frontend(2)]);
    let report = w
        .apply(&desired(&[(1, &[1, 2]), (2, &[3, 4])]))
        .expect("apply");
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    assert_eq!(report.rejected[0].frontend(), frontend(1));
    assert_eq!(master_count(&w, 2), 2);
}

#[test]
fn a_new_backend_gets_the_lowest_free_id_and_the_array_spans_the_ids() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
    w.apply(&desired(&[(1, &[1, 3])])).expect("apply");
    assert_eq!(
        w.entries().v4.backends,
        3,
        "index 0 and the ids of be1 and be3"
    );
    w.store.ops.clear();
    // be2's id is free again: the new backend takes it, and the span stays.
    w.apply(&desired(&[(1, &[1, 3, 4])])).expect("apply");
    assert_eq!(
        kinds(&w.store.ops),
        ["-slot3", "+be2", "+slot3=be2", "+master(count=3)"]
    );
    assert_eq!(w.entries().v4.backends, 4);
    // The highest ids go: the span shrinks with them.
    w.apply(&desired(&[(1, &[1])])).expect("apply");
    assert_eq!(w.entries().v4.backends, 2);
}

#[test]
fn an_ipv4_backend_array_too_small_for_the_next_id_refuses_the_frontend() {
    // Two entries: index 0 and one id.
    let mut w = sized_writer(100, 2);
    let report = w.apply(&desired(&[(1, &[1]), (2, &[2])])).expect("apply");
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    assert_eq!(report.rejected[0].frontend(), frontend(2));
    assert_eq!(master_count(&w, 1), 1);
}

#[test]
fn backend_map_full_is_reported_with_its_flag() {
    let mut w = sized_writer(100, 1);
    let report = w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
    assert!(report.rejected[0].to_string().contains("--max-backends"));
    assert_eq!(kinds(&w.store.ops), ["+master(count=0)"]);
}

#[test]
fn verification_reads_every_entry_once_per_pass_and_writes_nothing_without_drift() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2]), (2, &[2, 3, 4]), (3, &[])]))
        .expect("apply");
    // Masters and slots (3 + 5), then the 4 backends.
    let entries = 12;
    w.store.ops.clear();
    let whole = w.verify(1000).expect("verify");
    assert_eq!(
        whole,
        Verified {
            read: entries,
            restored: 0,
            pass_done: true
        }
    );
    assert!(w.store.ops.is_empty(), "{:?}", w.store.ops);

    // A small budget: the same entries over several calls, the pass done by the last.
    let mut calls = Vec::new();
    loop {
        let part = w.verify(3).expect("verify");
        calls.push(part);
        if part.pass_done {
            break;
        }
    }
    assert_eq!(
        calls.iter().map(|c| c.read).sum::<usize>(),
        entries,
        "{calls:?}"
    );
    assert!(calls.len() >= entries / 4, "{calls:?}");
    assert!(calls[..calls.len() - 1].iter().all(|c| !c.pass_done));
}

#[test]
fn a_backend_id_beyond_the_maps_room_is_not_adopted() {
    // A backend read back with an id near 2^32 (written by hand, or by an older agent
    // whose ids only grew): the writer's ids are dense, so it is not adopted, and the ids
    // below it cost nothing (the mirror is indexed by id, and so is a verification pass).
    let contents = MapContents {
        backends: vec![
            (1, backends(&[1])[0], Some(Protocol::Tcp)),
            (u32::MAX - 1, backends(&[2])[0], Some(Protocol::Tcp)),
        ],
        ..MapContents::default()
    };
    let mut w = Writer::adopt(Recorder::default(), CAPACITY, contents);
    assert_eq!(w.backend_entries(), 1);
    let call = w.verify(10).expect("verify");
    assert!(call.pass_done, "{call:?}");
    // Deleted before any id is handed out, and be1 with it: no slot names it.
    assert_eq!(
        next_apply(&mut w),
        [format!("-be{}", u32::MAX - 1), "-be1".to_owned()]
    );
}

#[test]
fn verification_writes_back_what_was_deleted_or_changed_behind_the_writer() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2]), (2, &[3])]))
        .expect("apply");
    let held = (w.store.services.clone(), w.store.backends.clone());
    // By hand: one master deleted, one slot pointed elsewhere, one backend deleted.
    w.store.check_every_write = false;
    w.store.services.remove(&service_key(&frontend(1), 0));
    let other = w.store.services[&service_key(&frontend(1), 2)];
    w.store.services.insert(service_key(&frontend(2), 1), other);
    let SlotValue::Backend { id, .. } = w.store.services[&service_key(&frontend(1), 1)] else {
        panic!("slot 1 holds a master");
    };
    w.store.backends.remove(&id);
    w.store.ops.clear();
    w.store.check_every_write = true;

    let verified = w.verify(1000).expect("verify");
    assert_eq!(verified.restored, 3, "{:?}", kinds(&w.store.ops));
    assert_eq!((w.store.services.clone(), w.store.backends.clone()), held);
    // Restored: the next pass finds nothing.
    assert_eq!(w.verify(1000).expect("verify").restored, 0);
}

#[test]
fn the_walk_finds_what_the_writer_did_not_write_and_the_next_apply_deletes_it() {
    let mut w = writer();
    w.apply(&desired(&[(1, &[1, 2]), (2, &[3])]))
        .expect("apply");
    let held = (w.store.services.clone(), w.store.backends.clone());
    // By hand: a slot above a count, a master of a frontend the writer never had, a
    // backend no slot names.
    let slot = w.store.services[&service_key(&frontend(1), 1)];
    w.store.services.insert(service_key(&frontend(2), 2), slot);
    w.store.services.insert(
        service_key(&frontend(9), 0),
        SlotValue::Master(Master::default()),
    );
    w.store
        .backends
        .insert(77, (backends(&[77])[0], Protocol::Tcp));
    let entries = w.store.services.len() + w.store.backends.len();

    // In small steps: every entry read once over the pass, the three found.
    let mut steps = Vec::new();
    loop {
        let step = w.find_extras(2).expect("walk");
        steps.push(step);
        if step.pass_done {
            break;
        }
    }
    assert_eq!(steps.iter().map(|s| s.read).sum::<usize>(), entries);
    assert_eq!(steps.iter().map(|s| s.found).sum::<usize>(), 3, "{steps:?}");
    assert!(steps[..steps.len() - 1].iter().all(|s| !s.pass_done));

    w.store.ops.clear();
    w.apply_changes(&BTreeMap::new()).expect("apply");
    let mut deleted = kinds(&w.store.ops);
    deleted.sort();
    assert_eq!(deleted, ["-be77", "-master", "-slot2"]);
    assert_eq!((w.store.services.clone(), w.store.backends.clone()), held);
    // Accounted for while they were there, and no longer.
    assert_eq!(w.service_entries(), 3 + 2);
    assert_eq!(w.backend_entries(), 3);
    // The next pass finds nothing.
    let again = w.find_extras(1000).expect("walk");
    assert_eq!((again.found, again.pass_done), (0, true));
}

#[test]
fn only_frontends_not_programmed_as_desired_have_drifted() {
    let mut w = writer();
    let before = desired(&[(1, &[1, 2]), (2, &[3]), (3, &[])]);
    w.apply(&before).expect("apply");
    assert!(w.drifted(&before).is_empty());
    // Same backends in another order: nothing to write.
    assert!(
        w.drifted(&desired(&[(1, &[2, 1]), (2, &[3]), (3, &[])]))
            .is_empty()
    );

    let mut after = desired(&[(1, &[1, 2]), (2, &[3, 4]), (4, &[5])]);
    let mut affinity = after.frontends[&frontend(1)].clone().into_owned();
    affinity.affinity_timeout_seconds = Some(60);
    after.insert(frontend(1), affinity);
    let drifted = w.drifted(&after);
    let frontends: Vec<(Frontend, bool)> = drifted
        .iter()
        .map(|(frontend, spec)| (*frontend, spec.is_some()))
        .collect();
    assert_eq!(
        frontends,
        [
            (frontend(1), true),
            (frontend(2), true),
            (frontend(3), false),
            (frontend(4), true)
        ]
    );
    // Applying only those makes the maps what a whole apply would.
    w.apply_changes(&drifted).expect("apply");
    assert!(w.drifted(&after).is_empty());
    let mut whole = writer();
    whole.apply(&after).expect("apply");
    assert_eq!(w.store.services.len(), whole.store.services.len());
    assert_eq!(w.store.backends.len(), whole.store.backends.len());
}

/// `wanted` and an IPv6 frontend of one backend, which it returns too.
fn with_an_ipv6_frontend(mut wanted: Desired<'static>) -> (Frontend, Desired<'static>) {
    let v6 = Frontend::internal(
        std::net::Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 1),
        80,
        Protocol::Tcp,
    );
    wanted.insert(
        v6,
        FrontendSpec {
            backends: vec![BackendAddr::local(
                std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                8080,
            )],
            affinity_timeout_seconds: None,
            source_ranges: None,
            maglev: false,
            no_endpoints: false,
        },
    );
    (v6, wanted)
}

#[test]
fn each_family_is_counted_against_its_own_maps() {
    // Room for the IPv4 frontend and its two backends (the IPv4 backend array spans index
    // 0 and their ids); for the IPv6 one's entries, but not its backend.
    let capacity = Capacity {
        v4: Room {
            service_entries: 3,
            backends: 3,
        },
        v6: Room {
            service_entries: 2,
            backends: 0,
        },
    };
    let mut w = Writer::adopt(Recorder::default(), capacity, MapContents::default());
    let (v6, wanted) = with_an_ipv6_frontend(desired(&[(1, &[1, 2])]));
    let report = w.apply(&wanted).expect("apply");

    // IPv4 fits exactly, whatever IPv6 holds; the IPv6 backend has no room in its own map.
    assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
    assert_eq!(report.rejected[0].frontend(), v6);
    let message = report.rejected[0].to_string();
    assert!(message.contains("socklb_be6_v1"), "{message}");
    assert_eq!(master_count(&w, 1), 2);
    let held = w.entries();
    assert_eq!(held.v4, capacity.v4);
    assert_eq!(
        held.v6,
        Room {
            service_entries: 2,
            backends: 0,
        },
        "the refused frontend has its master only, counted as a frontend's least"
    );

    // What growing would have to give each family, and one name per frontend.
    let demand = w.demand(wanted.iter().map(|(f, spec)| (f, Some(spec))));
    assert_eq!(demand.maps.v4, capacity.v4);
    assert_eq!(
        demand.maps.v6,
        Room {
            service_entries: 2,
            backends: 1,
        }
    );
    assert_eq!(demand.frontends, 2);
}

#[test]
fn each_family_has_ids_of_its_own() {
    let mut w = writer();
    let (_, wanted) = with_an_ipv6_frontend(desired(&[(1, &[1, 2])]));
    w.apply(&wanted).expect("apply");
    let mut puts: Vec<String> = kinds(&w.store.ops)
        .into_iter()
        .filter(|op| op.starts_with("+be"))
        .collect();
    puts.sort();
    let first_ipv6 = format!("+be{}", backends::IPV6_ID | 1);
    assert_eq!(puts, ["+be1", "+be2", first_ipv6.as_str()]);
    // The IPv6 backend takes no index of the IPv4 array.
    assert_eq!(w.entries().v4.backends, 3);
    assert_eq!(w.entries().v6.backends, 1);
}
