"""Other machines: rsync of policies to the inference boxes, the train stage run on a host over SSH, and a GPU
rented for a session: renting it, the RL loop run through it, the fleet that samples between sessions and the
cost model of both. Imports training and everything below."""
