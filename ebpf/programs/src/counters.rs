//! Per-CPU event counters; no atomics needed since each CPU writes only its own copy.
use socklb_abi::Counters;

use crate::maps::COUNTERS;

#[inline(always)]
pub fn bump(field: fn(&mut Counters) -> &mut u64) {
    if let Some(counters) = COUNTERS.get_ptr_mut(0) {
        // SAFETY: the pointer comes from the map lookup and this CPU's copy is not shared.
        let value = field(unsafe { &mut *counters });
        *value = value.wrapping_add(1);
    }
}
