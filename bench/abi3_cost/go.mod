// A module of its own, so the repository's `go vet ./...`, `go build ./...`
// and `go test ./...` never see this benchmark extension.
module millpond.invalid/bench/abi3cost

go 1.26.0
