use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = socklb_agent::cli::Cli::parse();
    socklb_agent::cli::init_tracing(&cli);
    socklb_agent::cli::main(cli)
}
