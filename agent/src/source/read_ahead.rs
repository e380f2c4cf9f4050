//! Files read and parsed a few at a time on threads of their own, handed out in order: the
//! first read of 100,000 Services' manifests (100 MB of YAML) took seven seconds on one
//! core, most of the time to ready.
use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    thread::{self, JoinHandle},
};

/// An iterator over `(file, read(file))` in the files' order, with up to `window` files
/// being read at once: so at most that many files' results are held besides the one
/// handed out.
pub struct ReadAhead<T> {
    files: std::vec::IntoIter<PathBuf>,
    reading: VecDeque<(PathBuf, JoinHandle<T>)>,
    window: usize,
    read: fn(&Path) -> T,
}

impl<T: Send + 'static> ReadAhead<T> {
    pub fn new(files: Vec<PathBuf>, window: usize, read: fn(&Path) -> T) -> Self {
        Self {
            files: files.into_iter(),
            reading: VecDeque::new(),
            window: window.max(1),
            read,
        }
    }
}

/// As many files at once as the node has cores: parsing is CPU work.
pub fn window_for_this_machine() -> usize {
    thread::available_parallelism().map_or(1, usize::from)
}

impl<T: Send + 'static> Iterator for ReadAhead<T> {
    type Item = (PathBuf, T);

    fn next(&mut self) -> Option<Self::Item> {
        while self.reading.len() < self.window {
            let Some(file) = self.files.next() else { break };
            let read = self.read;
            let path = file.clone();
            self.reading
                .push_back((file, thread::spawn(move || read(&path))));
        }
        let (file, reading) = self.reading.pop_front()?;
        // A panic while reading is the reader's bug: it goes on here, as if read inline.
        let result = reading
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Some((file, result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow_for_early_files(file: &Path) -> String {
        let name = file.display().to_string();
        // The first files take longest: a reader that handed out whatever ended first
        // would give them last.
        let delay = match name.as_str() {
            "a" => 30,
            "b" => 20,
            _ => 0,
        };
        thread::sleep(std::time::Duration::from_millis(delay));
        name.to_uppercase()
    }

    #[test]
    fn hands_out_every_file_in_order_whatever_ends_first() {
        let files: Vec<PathBuf> = ["a", "b", "c", "d", "e"].map(PathBuf::from).to_vec();
        for window in [1, 2, 3, 8] {
            let read: Vec<(String, String)> =
                ReadAhead::new(files.clone(), window, slow_for_early_files)
                    .map(|(file, text)| (file.display().to_string(), text))
                    .collect();
            let expected: Vec<(String, String)> = ["a", "b", "c", "d", "e"]
                .map(|f| (f.to_owned(), f.to_uppercase()))
                .to_vec();
            assert_eq!(read, expected, "window {window}");
        }
    }

    #[test]
    fn no_file_no_thread() {
        let mut read = ReadAhead::new(Vec::new(), 2, slow_for_early_files);
        assert_eq!(read.next(), None);
    }
}
