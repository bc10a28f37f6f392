//! `uprobe-run`: runs a program with the runtime preloaded, lists what can be probed in it,
//! or attaches to a running process.
//!
//! The folders are the layers, bottom first, each importing only from those below it:
//! - `base`: refusals, system calls, ELF facts, file checks, the runtime and bundled
//!   libraries, the run specification's records;
//! - `args`: the command line's definitions (clap) and the `--config` file's format;
//! - `plan`: the arguments as a typed plan, one per mode, every refusal of an option made;
//! - `output`: what uprobe-run makes of what the runtime sends (`--serve`'s metrics);
//! - the modes: `launch`, `list` (a launch that lists) and `attach` (`--pid`).
//!
//! Here: arguments, then plan, then the mode; a refusal is one line and exit status 2.
#![deny(unsafe_code)]

mod args;
mod attach;
mod base;
mod launch;
mod list;
mod output;
mod plan;

use std::convert::Infallible;

use base::error::Error;
use base::runtime;
use plan::Plan;

/// Exit status of every refusal.
const REFUSED: i32 = 2;

fn main() {
    let error = match run() {
        Ok(never) => match never {},
        Err(error) => error,
    };
    eprintln!("uprobe-run: {error}");
    std::process::exit(REFUSED);
}

fn run() -> Result<Infallible, Error> {
    match Plan::new(args::Cli::from_args()?)? {
        Plan::Version => {
            let (path, origin) = runtime::locate()?;
            println!("uprobe-run {}", env!("CARGO_PKG_VERSION"));
            println!("runtime: {} ({})", path.display(), origin.describe());
            std::process::exit(0)
        }
        Plan::Reference(dir) => {
            let written = args::reference::write(&dir).map_err(|source| Error::Reference { path: dir, source })?;
            written.iter().for_each(|file| println!("{}", file.display()));
            std::process::exit(0)
        }
        Plan::Launch(launch) => launch::run(*launch),
        Plan::List(list) => list::run(list),
        Plan::Vars { place, program } => match plan::lines::vars::list(&place, &program) {
            Ok(text) => {
                print!("{text}");
                std::process::exit(0)
            }
            Err(reason) => Err(Error::Vars { place, reason }),
        },
        Plan::Attach(attach) => std::process::exit(attach::run(*attach)?),
        Plan::Lines(lines) => {
            let debug = plan::lines::debug::load(&lines.program).map_err(Error::LineRange)?;
            let text = plan::lines::listing::show(&debug, &lines.range).map_err(Error::LineRange)?;
            print!("{text}");
            std::process::exit(0)
        }
    }
}
