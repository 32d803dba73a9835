mod auth;
mod badinput;
mod cli;
mod delivery;
