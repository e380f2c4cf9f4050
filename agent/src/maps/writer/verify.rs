//! Verifying the maps against the writer's mirror, a bounded part at a time: what was
//! deleted or changed behind the agent's back (by hand, with bpftool) is written back.
//!
//! Reading every entry back each resync would cost seconds at 100,000 Services (about a
//! microsecond per lookup), so each call reads at most a budget of entries and goes on
//! from there at the next call: backends by id, then frontends in order. A pass over
//! everything takes `entries / budget` calls. Only what the mirror says this agent wrote
//! is read back; entries it never wrote are found by the walk through the maps
//! (`extras.rs`).
use std::ops::Bound;

use super::{
    Op, SlotValue, Store, Writer, service_key, slot_number,
    verified::{Cursor, Verified, VerifyError},
};
use crate::desired::Frontend;

impl<S: Store> Writer<S> {
    /// Reads back about `budget` entries from where the last call stopped, and writes back
    /// those that differ from the mirror. Slots go before their master, as in an apply,
    /// so a lookup sees either the drifted frontend or the restored one.
    pub fn verify(&mut self, budget: usize) -> Result<Verified, VerifyError> {
        let mut verified = Verified::default();
        while verified.read < budget && !verified.pass_done {
            match self.verify_cursor {
                Cursor::Backends(from) => {
                    let wanted = budget - verified.read;
                    let ids: Vec<u32> = self.backends.held_from(from).take(wanted + 1).collect();
                    for id in ids.iter().take(wanted) {
                        self.verify_backend(*id, &mut verified)?;
                    }
                    self.verify_cursor = match ids.get(wanted) {
                        Some(next) => Cursor::Backends(*next),
                        None => Cursor::Frontends(None),
                    };
                }
                Cursor::Frontends(after) => {
                    let next = match after {
                        Some(last) => self
                            .frontends
                            .range((Bound::Excluded(last), Bound::Unbounded))
                            .next(),
                        None => self.frontends.iter().next(),
                    };
                    match next.map(|(frontend, _)| *frontend) {
                        Some(frontend) => {
                            self.verify_frontend(frontend, &mut verified)?;
                            self.verify_cursor = Cursor::Frontends(Some(frontend));
                        }
                        None => {
                            self.verify_cursor = Cursor::START;
                            verified.pass_done = true;
                        }
                    }
                }
            }
        }
        Ok(verified)
    }

    fn verify_frontend(
        &mut self,
        frontend: Frontend,
        verified: &mut Verified,
    ) -> Result<(), VerifyError> {
        let Some(programmed) = self.frontends.get(&frontend) else {
            return Ok(());
        };
        let master = service_key(&frontend, 0);
        let mut writes = Vec::new();
        for (index, id) in programmed.slots.iter().enumerate() {
            // 0: a slot the last re-read could not make sense of; the next apply writes it.
            let Some((backend, _)) = self.backends.get(*id).filter(|_| *id != 0) else {
                continue;
            };
            let key = service_key(&frontend, slot_number(index));
            let value = SlotValue::Backend { id: *id, backend };
            verified.read += 1;
            if self.store.read_slot(&key).map_err(VerifyError::Read)? != Some(value) {
                writes.push(Op::PutService { key, value });
            }
        }
        let value = SlotValue::Master(programmed.master());
        verified.read += 1;
        if self.store.read_slot(&master).map_err(VerifyError::Read)? != Some(value) {
            writes.push(Op::PutService { key: master, value });
        }
        self.restore(writes, verified)
    }

    fn verify_backend(&mut self, id: u32, verified: &mut Verified) -> Result<(), VerifyError> {
        let Some((backend, protocol)) = self.backends.get(id) else {
            return Ok(());
        };
        verified.read += 1;
        let read = self
            .store
            .read_backend(id, backend.address)
            .map_err(VerifyError::Read)?;
        if read != Some((backend, Some(protocol))) {
            let put = Op::PutBackend {
                id,
                backend,
                protocol,
            };
            self.restore(vec![put], verified)?;
        }
        Ok(())
    }

    fn restore(&mut self, writes: Vec<Op>, verified: &mut Verified) -> Result<(), VerifyError> {
        for op in writes {
            self.store.write(&op).map_err(VerifyError::Write)?;
            verified.restored += 1;
        }
        Ok(())
    }
}
