"""The processes of one evaluation and how they talk: the launcher, the judges' zygote, each rank's judge process
and the candidate's process beside it, their channel, shared pages and buffers."""
