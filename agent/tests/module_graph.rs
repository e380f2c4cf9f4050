//! The agent's modules import one another in one direction only: no module imports one that
//! imports it back, directly or around a circle (docs/architecture.md, "Data flows one
//! way"). The sources are parsed (syn) and every `crate::`, `super::` and `self::` path,
//! in `use` declarations and in code, is an edge to the module it names.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use syn::visit::Visit;

/// A module, as its path from the crate root (`["dataplane", "start"]`).
type Module = Vec<String>;

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    let modules: BTreeSet<Module> = files.iter().map(|file| module_of(&src, file)).collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let syntax =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parse {}: {e}", file.display()));
        let module = module_of(&src, file);
        let mut paths = Paths {
            file_module: module.clone(),
            inline: Vec::new(),
            found: Vec::new(),
        };
        paths.visit_file(&syntax);
        for target in paths.found {
            // The longest prefix that names a module of the crate.
            let named = (1..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|prefix| modules.contains(prefix));
            if let Some(named) = named
                && named != module
            {
                edges.entry(module.clone()).or_default().insert(named);
            }
        }
    }
    let circles = circles(&edges);
    assert!(
        circles.is_empty(),
        "modules that import each other (each line a circle): {circles:#?}"
    );
}

/// The paths a file names, resolved from `crate`, `super` and `self` to absolute paths.
struct Paths {
    file_module: Module,
    /// The inline modules (`mod tests { .. }`) the visitor is in.
    inline: Vec<String>,
    found: Vec<Module>,
}

impl Paths {
    fn resolve(&mut self, segments: &[String]) {
        let mut here: Module = self.file_module.clone();
        here.extend(self.inline.iter().cloned());
        let mut rest = segments;
        let mut base = match rest.first().map(String::as_str) {
            Some("crate") => {
                rest = &rest[1..];
                Vec::new()
            }
            Some("self") => {
                rest = &rest[1..];
                here
            }
            Some("super") => here,
            _ => return,
        };
        while rest.first().map(String::as_str) == Some("super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        // An inline module's paths belong to its file's module.
        if base.starts_with(&self.file_module) && base.len() > self.file_module.len() {
            let inline_part = &base[self.file_module.len()..];
            if self.inline.first() == inline_part.first() {
                return;
            }
        }
        self.found.push(base);
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.inline.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.inline.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut prefixes = Vec::new();
        use_paths(&item.tree, &mut Vec::new(), &mut prefixes);
        for path in prefixes {
            self.resolve(&path);
        }
    }

    /// `pub(super)` names who may see an item, not a module it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve(&segments);
        syn::visit::visit_path(self, path);
    }
}

/// Every path a `use` tree names (`a::{b, c::d}`: `a::b`, `a::c::d`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_paths(&path.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let mut path = prefix.clone();
            if name.ident != "self" {
                path.push(name.ident.to_string());
            }
            out.push(path);
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            path.push(rename.ident.to_string());
            out.push(path);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                use_paths(tree, prefix, out);
            }
        }
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// `src/dataplane/mod.rs` is `dataplane`, `src/dataplane/start.rs` is `dataplane::start`,
/// `src/lib.rs` and `src/main.rs` are the crate's roots.
fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).expect("under src");
    let mut module: Module = relative
        .with_extension("")
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if matches!(
        module.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        module.pop();
    }
    module
}

/// The circles of the graph (each as the modules on it), by depth-first search.
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    let mut found = BTreeSet::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((node, path)) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    circle.sort();
                    found.insert(circle);
                } else if !path.contains(next) && path.len() < 12 {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found.into_iter().collect()
}
