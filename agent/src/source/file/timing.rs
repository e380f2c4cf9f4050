//! How long the file source waits: for a burst of changes to end, for a writer to close its
//! file, for a shortened file to settle.
use std::time::Duration;

/// A burst of changes is read once it has been quiet this long...
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// ...or this long after its first change, so that edits every few milliseconds cannot hold
/// every other change back.
pub const DEBOUNCE_MAX: Duration = Duration::from_millis(200);

/// A file still open for writing is read anyway once it has not changed for this long (a
/// writer that keeps its file open).
pub const HOLD_MAX: Duration = Duration::from_secs(10);

/// A file whose new text loses objects, or is much shorter than the text applied (it may
/// lose endpoints), is applied only once it has not changed for this long: a file written with
/// several opens (`> f`, then `>> f`) is closed between its parts, and its first part alone
/// would take away what the later parts hold.
pub const SETTLE: Duration = Duration::from_secs(2);
