//! Applying a desired state: the service and backend maps first (their writer decides what
//! fits, growing the maps beforehand when it can), then the source ranges, the Maglev
//! tables and the names; and which backends left, for the sweep.
use std::collections::{BTreeMap, BTreeSet};

use socklb_abi::map_names;
use tracing::{debug, warn};

use super::{Dataplane, error::DataplaneError};
use crate::{
    desired::{
        Desired, Frontend, FrontendSpec, Gone, Scope,
        gone::{self, Programmed},
    },
    maps::{
        maglev::MaglevError,
        names::FrontendLabel,
        source_ranges::SourceRangeError,
        writer::{ApplyReport, Extras, Outcome, StoreError, Verified},
    },
};

impl Dataplane {
    /// Backends programmed for local sockets' frontends among `frontends`.
    pub(super) fn internal_backends<'a>(
        &self,
        frontends: impl Iterator<Item = &'a Frontend>,
    ) -> Programmed {
        frontends
            .filter(|f| f.scope == Scope::Internal)
            .filter_map(|f| Some((*f, self.writer.programmed(f)?.1)))
            .collect()
    }

    /// A full resync: every frontend whose desired state differs from what the writer
    /// programmed (a change the change tracking missed) is applied, without re-reading the
    /// service and backend maps: the resyncs' verification and walk repair their drift.
    /// The smaller maps (source ranges, Maglev, names) are re-read and rewritten where
    /// they differ.
    pub fn apply_drifted(&mut self, desired: &Desired<'_>) -> Result<ApplyReport, DataplaneError> {
        self.readopt_small_maps()?;
        self.apply(desired)
    }

    /// Makes the maps hold `desired`, writing only the differences and going through only
    /// the frontends that differ from the writer's mirror (at 100,000 Services with nothing
    /// to write, going through every frontend took a second). Frontends whose change does
    /// not fit are left as they were and listed in the report.
    pub fn apply(&mut self, desired: &Desired<'_>) -> Result<ApplyReport, DataplaneError> {
        let changes = self.writer.drifted(desired);
        let changed = || changes.iter().map(|(f, spec)| (f, *spec));
        self.make_room(self.writer.demand(changed()), self.maglev.demand(changed()));
        let before = self.internal_backends(changes.keys());
        let result = self.writer.apply_changes(&changes);
        self.apply_after_writer(desired, result, &before)
    }

    /// Grows the maps that cannot hold `desired`, when they can grow.
    pub(super) fn make_room_for(&mut self, desired: &Desired<'_>) {
        let frontends = || desired.iter().map(|(f, spec)| (f, Some(spec)));
        self.make_room(
            self.writer.demand(frontends()),
            self.maglev.demand(frontends()),
        );
    }

    /// The rest of [`Self::apply`] once the writer wrote the service and backend maps
    /// (`result`), with the internal backends programmed before it.
    pub(super) fn apply_after_writer(
        &mut self,
        desired: &Desired<'_>,
        result: Result<ApplyReport, StoreError>,
        before: &Programmed,
    ) -> Result<ApplyReport, DataplaneError> {
        let report = self.report_gone(result, before)?;
        // Every frontend the maps hold is marked now: the filter loses the slots of those
        // removed since, and the programs may trust it (from the first sync on).
        let writer = &self.writer;
        let marked = writer.store().frontend_filter.rebuild(writer.frontends());
        debug!(marked, "frontend filter rebuilt");
        let ranges = self.source_ranges.apply_all(desired.iter());
        let rest = self.report_ranges(ranges).and_then(|()| {
            self.apply_maglev(desired.iter().map(|(f, spec)| (f, Some(spec))), true)
        });
        self.finish(report, rest)
    }

    /// How many frontends are not programmed as desired now, by outcome, whichever sync
    /// rejected them.
    pub fn rejected_frontends(&self) -> [(Outcome, usize); 3] {
        self.writer.rejected()
    }

    /// Whether entries wait to be deleted by the next apply, which frees their room.
    pub fn has_pending_deletes(&self) -> bool {
        self.writer.has_pending_deletes()
    }

    /// Applies only the given frontends (`None`: remove it), leaving all others alone.
    pub fn apply_changes(
        &mut self,
        changes: &BTreeMap<Frontend, Option<&FrontendSpec>>,
    ) -> Result<ApplyReport, DataplaneError> {
        let changed = || changes.iter().map(|(f, spec)| (f, *spec));
        self.make_room(self.writer.demand(changed()), self.maglev.demand(changed()));
        let before = self.internal_backends(changes.keys());
        let result = self.writer.apply_changes(changes);
        let report = self.report_gone(result, &before)?;
        let ranges = self.source_ranges.apply(changes);
        let rest = self
            .report_ranges(ranges)
            .and_then(|()| self.apply_maglev(changes.iter().map(|(f, spec)| (f, *spec)), false));
        self.finish(report, rest)
    }

    /// The Maglev tables of `changes` (of every frontend when `full`).
    fn apply_maglev<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (&'a Frontend, Option<&'a FrontendSpec>)>,
        full: bool,
    ) -> Result<(), DataplaneError> {
        let writer = &self.writer;
        let tables = self.maglev.apply(changes, |f| writer.programmed(f), full);
        self.report_maglev(tables)
    }

    /// The writer's report with the pairs whose backend left since `before`, and those a
    /// failed sync left unswept whose backend has not come back. When the writer failed, the
    /// pairs it removed before failing (seen in the maps read again) wait for the next
    /// sync that succeeds.
    fn report_gone(
        &mut self,
        result: Result<ApplyReport, StoreError>,
        before: &Programmed,
    ) -> Result<ApplyReport, DataplaneError> {
        let result = self.report(result);
        let now = self.internal_backends(before.keys());
        let left = gone::gone(before, &now);
        let Ok(mut report) = result else {
            // Kept for take_unswept.
            self.unswept.extend(left);
            return result;
        };
        let mut pairs: BTreeSet<Gone> = left.into_iter().collect();
        pairs.extend(self.take_unswept());
        report.gone = pairs.into_iter().collect();
        Ok(report)
    }

    /// The pairs a failed sync removed from the maps before failing whose backend has not
    /// come back since: their sockets are closed all the same, since the maps no longer lead
    /// there (a sync that keeps failing would otherwise never close them).
    pub fn take_unswept(&mut self) -> Vec<Gone> {
        let unswept = std::mem::take(&mut self.unswept);
        self.still_gone(unswept)
    }

    /// Those of `pairs` whose backend is not programmed for its frontend now.
    pub fn still_gone(&self, pairs: Vec<Gone>) -> Vec<Gone> {
        let now = self.internal_backends(pairs.iter().map(|pair| &pair.frontend));
        gone::still_gone(pairs, &now)
    }

    /// `report` if the rest of the sync (source ranges, Maglev) succeeded; else its gone
    /// pairs are kept for [`Self::take_unswept`].
    fn finish(
        &mut self,
        report: ApplyReport,
        rest: Result<(), DataplaneError>,
    ) -> Result<ApplyReport, DataplaneError> {
        match rest {
            Ok(()) => Ok(report),
            Err(error) => {
                self.unswept.extend(report.gone);
                Err(error)
            }
        }
    }

    /// Records which Service each given frontend belongs to (`None`: gone), for `socklb
    /// inspect`; with `full`, the names of frontends not given are removed.
    pub fn apply_labels(
        &mut self,
        labels: impl IntoIterator<Item = (Frontend, Option<FrontendLabel>)>,
        full: bool,
    ) -> Result<(), DataplaneError> {
        let writer = &self.writer;
        let result = self.names.apply(labels, |f| writer.service_id(f), full);
        if let Err(error) = result {
            self.names
                .readopt()
                .map_err(DataplaneError::map(map_names::NAMES))?;
            return Err(DataplaneError::Names(error));
        }
        Ok(())
    }

    fn report_maglev(&mut self, result: Result<(), MaglevError>) -> Result<(), DataplaneError> {
        if let Err(error) = result {
            self.readopt()?;
            return Err(DataplaneError::Maglev(error));
        }
        Ok(())
    }

    fn report_ranges(
        &mut self,
        result: Result<Vec<SourceRangeError>, SourceRangeError>,
    ) -> Result<(), DataplaneError> {
        match result {
            Ok(rejected) => {
                for error in rejected {
                    warn!(%error, "source ranges not programmed");
                }
                Ok(())
            }
            Err(error) => {
                self.readopt()?;
                Err(DataplaneError::SourceRanges(error))
            }
        }
    }

    fn report(
        &mut self,
        result: Result<ApplyReport, StoreError>,
    ) -> Result<ApplyReport, DataplaneError> {
        match result {
            // The caller logs the rejected frontends (only their changes).
            Ok(report) => Ok(report),
            Err(error) => {
                self.readopt()?;
                Err(DataplaneError::Write(error))
            }
        }
    }

    /// Reads back about `budget` service and backend entries from where the last call
    /// stopped, and writes back those that drifted from what this agent wrote; then walks
    /// on through about `walk_budget` entries of the maps for those it did not write,
    /// which the next apply deletes.
    pub fn verify(
        &mut self,
        budget: usize,
        walk_budget: usize,
    ) -> Result<(Verified, Extras), DataplaneError> {
        let result = self
            .writer
            .verify(budget)
            .and_then(|verified| Ok((verified, self.writer.find_extras(walk_budget)?)));
        result.or_else(|error| {
            // A write back that failed left the mirror ahead of the maps.
            self.readopt()?;
            Err(DataplaneError::Verify(error))
        })
    }

    /// Forgets the writer's mirror and reads the maps again: repairs any drift (entries
    /// changed or removed by hand) at the next apply.
    pub fn readopt(&mut self) -> Result<(), DataplaneError> {
        let contents = self
            .writer
            .store_mut()
            .read()
            .map_err(DataplaneError::map(map_names::SERVICES))?;
        self.writer.readopt(contents);
        self.readopt_small_maps()
    }

    /// Reads the source-range, Maglev and names maps again, each at most an entry per
    /// frontend (or per Maglev slot): what drifted there is rewritten by the next apply.
    fn readopt_small_maps(&mut self) -> Result<(), DataplaneError> {
        self.source_ranges
            .readopt()
            .map_err(DataplaneError::map(map_names::SOURCE_RANGES))?;
        self.maglev
            .readopt()
            .map_err(DataplaneError::map(map_names::MAGLEV))?;
        self.names
            .readopt()
            .map_err(DataplaneError::map(map_names::NAMES))?;
        Ok(())
    }
}
