//! A benchmark's command line: `--flag value` pairs and the `--smoke` switch (a run of
//! seconds that keeps the benchmark working in CI), with errors that show the usage.
use anyhow::Context as _;

pub struct Flags<'a> {
    args: std::slice::Iter<'a, String>,
    usage: &'static str,
    /// Whether `--smoke` was given (once [`next_flag`](Self::next_flag) has returned `None`).
    pub smoke: bool,
}

impl<'a> Flags<'a> {
    pub fn new(args: &'a [String], usage: &'static str) -> Self {
        Self {
            args: args.iter(),
            usage,
            smoke: false,
        }
    }

    /// The next flag and its value; `--smoke`, which takes none, is recorded instead.
    pub fn next_flag(&mut self) -> anyhow::Result<Option<(&'a str, &'a str)>> {
        while let Some(flag) = self.args.next() {
            if flag == "--smoke" {
                self.smoke = true;
                continue;
            }
            let value = self
                .args
                .next()
                .with_context(|| format!("{flag} needs a value\n{}", self.usage))?;
            return Ok(Some((flag, value)));
        }
        Ok(None)
    }

    /// `value` of `flag` as a whole number.
    pub fn number(&self, flag: &str, value: &str) -> anyhow::Result<u32> {
        value
            .parse()
            .with_context(|| format!("{flag} {value}: not a number\n{}", self.usage))
    }

    /// `value` of `flag` as comma-separated whole numbers, such as `example`.
    pub fn numbers(&self, flag: &str, value: &str, example: &str) -> anyhow::Result<Vec<u32>> {
        value
            .split(',')
            .map(|count| count.trim().parse())
            .collect::<Result<_, _>>()
            .with_context(|| format!("{flag} {value}: a list like {example}\n{}", self.usage))
    }
}
