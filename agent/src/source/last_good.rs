//! A manifest's last text that parsed, kept compressed: the file source needs it again only
//! to parse it anew when a full `Reset` comes while the file does not parse (its objects are
//! kept), and the manifests of 100,000 Services are 106 MB of text.
use xxhash_rust::xxh3::xxh3_128;

#[derive(Debug)]
pub struct LastGood {
    len: usize,
    /// Whether a text read later is the same one, without the text.
    hash: u128,
    /// LZ4 blocks: YAML manifests repeat themselves, and decompressing them costs little.
    compressed: Vec<u8>,
}

impl LastGood {
    pub fn new(text: &str) -> Self {
        Self {
            len: text.len(),
            hash: xxh3_128(text.as_bytes()),
            compressed: lz4_flex::compress_prepend_size(text.as_bytes()),
        }
    }

    pub fn is(&self, text: &str) -> bool {
        self.len == text.len() && self.hash == xxh3_128(text.as_bytes())
    }

    /// The text's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The text again. Empty only if the compressed copy was corrupted in memory, which
    /// parses as a file without objects.
    pub fn text(&self) -> String {
        lz4_flex::decompress_size_prepended(&self.compressed)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_the_text_back_and_knows_it_again() {
        let text = "apiVersion: v1\nkind: Service\n".repeat(1000) + "é\n";
        let kept = LastGood::new(&text);
        assert_eq!(kept.text(), text);
        assert_eq!(kept.len(), text.len());
        assert!(kept.is(&text));
        assert!(
            !kept.is(&text.replace("v1", "v2")),
            "same length, other text"
        );
        assert!(!kept.is(&(text.clone() + " ")));
        assert!(
            kept.compressed.len() * 10 < text.len(),
            "repetitive YAML is kept in much less room: {} of {}",
            kept.compressed.len(),
            text.len()
        );
    }

    #[test]
    fn an_empty_text_is_kept_too() {
        let kept = LastGood::new("");
        assert_eq!(kept.text(), "");
        assert!(kept.is(""));
    }
}
