"""Other machines: rsync of policies to the inference boxes, the train stage run on a host over SSH, and renting a
GPU for a burst from a provider. Imports training and everything below."""
