"""The store: content-addressed blobs, trees and images (git's object model), refs, lineage, on local disk, PostgreSQL or S3."""
