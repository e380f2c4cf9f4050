//! Text from outside the agent made safe to show on a terminal. Names and values that
//! `trace`, `explain` and `inspect` print come from whoever created them: a process chooses
//! its own name, a Service's author its name, its ports' names and its annotations (the file
//! source and older API servers accept any character). Printed raw, such text can carry a
//! terminal escape sequence (retitle the window, clear the screen, forge lines) or reverse
//! the direction of what follows.

use std::borrow::Cow;

/// `text` safe to show on a terminal: control characters (a terminal escape sequence, a
/// newline that forges a line), invisible and direction-changing characters and the
/// backslash are shown escaped, Rust style (`\x1b`, `\u{202e}`, `\\`), so that the escaped
/// form cannot be mistaken for the plain one. Everything else is kept as is.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c == '\\'
            || c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    if !text.chars().any(unsafe_char) {
        return text.into();
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => shown.push_str("\\\\"),
            c if unsafe_char(c) && u32::from(c) < 0x100 => {
                shown.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if unsafe_char(c) => shown.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => shown.push(c),
        }
    }
    shown.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_characters_are_escaped_and_the_rest_kept() {
        let cases = [
            ("curl", "curl"),
            ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
            ("a\nb\r\t", "a\\x0ab\\x0d\\x09"),
            ("back\\slash", "back\\\\slash"),
            ("\u{9b}31m", "\\x9b31m"),
            ("evil\u{202e}gpj", "evil\\u{202e}gpj"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
            ("naïve", "naïve"),
        ];
        for (raw, shown) in cases {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
        assert!(matches!(printable("plain"), Cow::Borrowed("plain")));
    }
}
