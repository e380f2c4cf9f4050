//! Finding what the maps hold that the writer did not write (an entry added by hand, or
//! left by another program): the other half of verifying the maps, which reads back only
//! what the mirror holds.
//!
//! A walk through the maps reads them in the kernel's own order, a bounded step at each
//! resync (one batch read per few thousand entries, about a tenth of a lookup's cost per
//! entry), and compares every entry with the mirror. What the mirror does not account for
//! is deleted by the next apply, as if a full re-read had found it, so the hourly full
//! resync no longer needs to re-read two million entries at 100,000 Services.
use super::{
    Store, Writer,
    verified::{Extras, VerifyError},
};

impl<S: Store> Writer<S> {
    /// Reads about `budget` entries of the maps from where the last call stopped, and
    /// has the next apply delete those that no frontend's count covers, that name no
    /// frontend this agent knows, or that are backends the mirror does not hold.
    pub fn find_extras(&mut self, budget: usize) -> Result<Extras, VerifyError> {
        let (contents, next) = self
            .store
            .walk(self.walk_from, budget)
            .map_err(VerifyError::Read)?;
        self.walk_from = next.unwrap_or_default();
        let mut extras = Extras {
            read: contents.len(),
            found: 0,
            pass_done: next.is_none(),
        };
        for (key, _) in contents.services {
            let covered = self
                .frontends
                .get(&key.frontend)
                .is_some_and(|programmed| usize::from(key.slot) <= programmed.slots.len());
            if !covered && !self.pending_deletes.contains(&key) {
                self.delete_later([key]);
                extras.found += 1;
            }
        }
        for key in contents.strays {
            if self.strays.insert(key) {
                *self.service_entries.of(key.is_ipv6()) += 1;
                extras.found += 1;
            }
        }
        for (id, addr, _) in contents.backends {
            // Kept apart from the mirror, whose ids bound the verification's pass.
            if !self.backends.contains(id) && self.stray_backends.insert((id, addr.address)) {
                extras.found += 1;
            }
        }
        Ok(extras)
    }
}
