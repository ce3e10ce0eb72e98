"""Set-up shared by the training commands: process groups and DeepSpeed (`distributed`),
checkpoints (`checkpoint`), the optimizer and its schedule (`optim`) and the run log (`runlog`)."""
