module zerohop.dev/bench/go

go 1.22
