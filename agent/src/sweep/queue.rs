//! The pairs waiting for the sweeping thread. Every sync adds the pairs whose backend left
//! and drops the queued ones whose backend has come back since, so that the thread sweeps a
//! batch as the maps stand when it takes it, never a backend that is serving again.
use std::{
    collections::BTreeSet,
    sync::{Condvar, Mutex, PoisonError},
};

use crate::desired::Gone;

#[derive(Default)]
pub struct Queue {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    pairs: BTreeSet<Gone>,
    closed: bool,
}

impl Queue {
    /// Adds `gone`, after keeping of the queued pairs only those `still_gone` returns.
    pub fn push(
        &self,
        gone: impl IntoIterator<Item = Gone>,
        still_gone: impl FnOnce(Vec<Gone>) -> Vec<Gone>,
    ) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let queued = std::mem::take(&mut state.pairs);
        state.pairs = still_gone(queued.into_iter().collect())
            .into_iter()
            .collect();
        state.pairs.extend(gone);
        if !state.pairs.is_empty() {
            self.wake.notify_one();
        }
    }

    /// Every queued pair, once there is one; `None` once closed.
    pub fn take(&self) -> Option<Vec<Gone>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if state.closed {
                return None;
            }
            if !state.pairs.is_empty() {
                return Some(std::mem::take(&mut state.pairs).into_iter().collect());
            }
            state = self
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Ends [`Self::take`]: the thread stops.
    pub fn close(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::desired::{BackendAddr, Frontend, Protocol};

    fn pair(backend: u8) -> Gone {
        Gone {
            frontend: Frontend::internal(Ipv4Addr::new(10, 96, 0, 10), 53, Protocol::Udp),
            backend: BackendAddr::local(Ipv4Addr::new(10, 0, 0, backend), 53),
        }
    }

    #[test]
    fn a_queued_pair_whose_backend_came_back_is_not_swept() {
        let queue = Queue::default();
        queue.push([pair(1), pair(2)], |queued| queued);
        // The next sync programs backend 1 again.
        queue.push([pair(3)], |queued| {
            queued.into_iter().filter(|p| *p != pair(1)).collect()
        });
        assert_eq!(queue.take(), Some(vec![pair(2), pair(3)]));
    }

    #[test]
    fn take_waits_for_a_pair() {
        let queue = std::sync::Arc::new(Queue::default());
        let taker = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.take())
        };
        queue.push([pair(1)], |queued| queued);
        assert_eq!(taker.join().expect("the taker"), Some(vec![pair(1)]));
    }

    #[test]
    fn take_ends_once_closed() {
        let queue = Queue::default();
        queue.push([pair(1)], |queued| queued);
        queue.close();
        assert_eq!(queue.take(), None);
    }
}
